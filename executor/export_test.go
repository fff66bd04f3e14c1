package executor

// SetAfterRead makes e run f between its read of a session and the claim
// taken as read, so that a test can change the session in between.
func SetAfterRead(e *Executor, f func()) { e.afterRead = f }
