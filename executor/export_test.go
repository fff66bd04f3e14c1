package executor

// SetAfterRead makes e run f between its read of a session and the claim
// taken as read, so that a test can change the session in between.
func SetAfterRead(e *Executor, f func()) { e.afterRead = f }

// SetBeforeRunEnds makes e run f when a run's execution has returned,
// before the run decides whether to go again.
func SetBeforeRunEnds(e *Executor, f func(sessionID string)) { e.beforeRunEnds = f }

// HandBacks is how many runs owe a hand-back now (owesSlot).
func HandBacks(e *Executor) int32 { return e.handBacks.Load() }

// SetBeforePromote makes e run f before each promotion's transaction under
// a claim taken alone (permission replies, continuations).
func SetBeforePromote(e *Executor, f func()) { e.beforePromote = f }

// SlotWaiters is how many wakes wait in Wake for a slot now.
func SlotWaiters(e *Executor) int32 { return e.slotWaiters.Load() }
