package executor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// execBundle is an Executor on a real database without Kafka: prompts are
// admitted with the Admitter, wakes are handed over directly, and what
// would be published is read from the outbox table.
type execBundle struct {
	pool     *pgxpool.Pool
	admitter *admission.Admitter
}

func setupExec(t *testing.T) *execBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	return &execBundle{pool: pool, admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{})}
}

func (b *execBundle) executor(t *testing.T, owner string, provider provider.Provider, lease time.Duration, maxSessions int) *executor.Executor {
	t.Helper()
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: lease, OwnerID: owner})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: provider, MaxSessions: maxSessions})
	t.Cleanup(e.StopNow)
	return e
}

func (b *execBundle) admit(t *testing.T, session, msg, text string) {
	t.Helper()
	_, err := b.admitter.Admit(context.Background(), []admission.Incoming{{Prompt: envelope.Prompt{MessageID: msg, SessionID: session, Text: text, Delivery: envelope.DeliveryQueue}}})
	require.NoError(t, err)
}

func (b *execBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

func (b *execBundle) answered(t *testing.T, msg string) int {
	return b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'completed' AND $1 = ANY(answers)`, msg)
}

func wait(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("timed out")
	}
}

// blockingProvider blocks every call until its gate opens, and says when a
// call started.
type blockingProvider struct {
	started chan string
	gate    chan struct{}
	calls   atomic.Int32
}

func newBlockingProvider() *blockingProvider {
	return &blockingProvider{started: make(chan string, 16), gate: make(chan struct{})}
}

func (p *blockingProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	p.calls.Add(1)
	p.started <- req.Turn[0].ID
	select {
	case <-p.gate:
		return provider.Response{Text: "ok"}, nil
	case <-ctx.Done():
		return provider.Response{}, ctx.Err()
	}
}

func TestExecutor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// docs/design.md, invariant 7: a wake for a session whose claim is live
	// elsewhere is dropped; the holder sees the input before it releases.
	t.Run("WakeForClaimHeldElsewhereIsDroppedAndTheHolderRunsTheInput", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		holder := b.executor(t, "holder", p, 5*time.Second, 0)
		other := b.executor(t, "other", scripted.ScriptedProvider{}, 5*time.Second, 0)

		b.admit(t, "s", "m1", "first")
		done1, err := holder.Wake(ctx, "s", 0)
		require.NoError(t, err)
		require.Equal(t, "m1", <-p.started)

		b.admit(t, "s", "m2", "second") // admitted while the holder runs
		done2, err := other.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done2) // dropped at once: the claim is held
		require.Zero(t, b.answered(t, "m2"))

		close(p.gate)
		wait(t, done1)
		require.Equal(t, 1, b.answered(t, "m1"))
		require.Equal(t, 1, b.answered(t, "m2"), "the holder ran the input admitted during its turn")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, int32(2), p.calls.Load())
	})

	// The race the other way round: admission commits after the holder's
	// release; its own wake then starts a new execution.
	t.Run("InputAdmittedAfterReleaseGetsItsOwnWake", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		e := b.executor(t, "a", scripted.ScriptedProvider{}, 5*time.Second, 0)
		b.admit(t, "s", "m1", "first")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		b.admit(t, "s", "m2", "second")
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 's'`))
		done, err = e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m2"))
	})

	t.Run("RevokedRunFinishesItsTurnAndReleasesWithAWake", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 5*time.Second, 0)
		b.admit(t, "s", "m1", "first")
		b.admit(t, "s", "m2", "second")
		wakesBefore := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 's'`)
		done, err := e.Wake(ctx, "s", 3)
		require.NoError(t, err)
		require.Equal(t, "m1", <-p.started)

		e.Revoke([]int32{3}) // returns at once: never blocks the rebalance
		close(p.gate)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m1"), "the running turn was not cut off")
		require.Zero(t, b.answered(t, "m2"), "no new turn after revocation")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, wakesBefore+1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 's'`),
			"released with a wake for the waiting input, for the partition's next owner")
	})

	t.Run("StopGraceLetsTurnsFinish", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 5*time.Second, 0) // StopGrace: 30s
		b.admit(t, "s", "m1", "first")
		_, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		stopped := make(chan struct{})
		go func() { defer close(stopped); e.Stop() }()
		close(p.gate)
		wait(t, stopped)
		require.Equal(t, 1, b.answered(t, "m1"))
		_, err = e.Wake(ctx, "s2", 0)
		require.ErrorIs(t, err, executor.ErrStopped)
	})

	t.Run("StopPastGraceCancelsAndSettlesAsInterrupted", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		var log testkit.LogBuffer
		nudges := &nudgeLog{}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, StopGrace: time.Nanosecond, Logger: testkit.Logger(t, &log),
			OnCommitFunc: nudges.onCommit(b)})
		t.Cleanup(e.StopNow)
		b.admit(t, "s", "m1", "first")
		b.admit(t, "s", "m2", "second")
		before := b.count(t, `SELECT max(id) FROM outbox`)
		_, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		e.Stop() // grace over at once
		require.Contains(t, log.String(), "shutdown grace over; cancelling running turns")
		var status, reason string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT m.status, convert_from(o.payload, 'UTF8')::jsonb->>'reason' FROM messages m
			JOIN outbox o ON convert_from(o.payload, 'UTF8')::jsonb->>'assistant_message_id' = m.message_id
			WHERE m.role = 'assistant' AND 'm1' = ANY(m.answers)`).Scan(&status, &reason))
		require.Equal(t, "errored", status)
		require.Equal(t, envelope.FailInterrupted, reason)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim is released")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND convert_from(payload, 'UTF8')::jsonb->>'reason' = 'released'`),
			"m2 waits: released with a wake")
		require.Equal(t, int32(1), p.calls.Load(), "the interrupted call is not retried")
		// The writes after the cancellation (the turn's failure, the
		// release) nudge the relay as every commit does.
		requireNudgedAfterEachCommit(t, b, before, nudges.get())
		require.Equal(t, 3, b.count(t, `SELECT count(DISTINCT created_at) FROM outbox WHERE key = 's' AND id > $1`, before),
			"the claim with the first turn, its failure, the release")
	})

	// The hard stop ends a graceful one still within its grace, and either
	// may be called again once stopped.
	t.Run("StopNowAndStopTogetherAndTwice", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 5*time.Second, 0)
		b.admit(t, "s", "m1", "first")
		_, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		var wg sync.WaitGroup
		wg.Go(e.Stop) // waits for the gate, never opened, for 30s
		wg.Go(e.StopNow)
		stopped := make(chan struct{})
		go func() { wg.Wait(); close(stopped) }()
		wait(t, stopped)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the cancelled turn released its claim")

		e.StopNow()
		e.Stop()
		_, err = e.Wake(ctx, "s2", 0)
		require.ErrorIs(t, err, executor.ErrStopped)
	})

	// The end of Start's ctx turns a graceful stop under way hard: the
	// stop does not wait out its grace for a turn that never ends.
	t.Run("StartCtxEndingDuringAStopTurnsItHard", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, StopGrace: time.Hour})
		require.NoError(t, err)
		t.Cleanup(e.StopNow)
		started, cancel := context.WithCancel(ctx)
		defer cancel()
		require.NoError(t, e.Start(started))
		b.admit(t, "s", "m1", "first")
		_, err = e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		stopped := make(chan struct{})
		go func() { defer close(stopped); e.Stop() }() // the gate stays shut: an hour's grace
		require.Eventually(t, func() bool {
			_, err := e.Wake(ctx, "s2", 0)
			return errors.Is(err, executor.ErrStopped)
		}, 20*time.Second, time.Millisecond, "the stop began")
		cancel()
		wait(t, stopped)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the cancelled turn released its claim")
	})

	// The hard stop's warning names the runs it cancels, and an idle hard
	// stop has none to name.
	t.Run("HardStopIsWarnedOnlyWhenRunsAreCancelled", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		var idleLog, busyLog testkit.LogBuffer
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		idle := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: newBlockingProvider(), Logger: testkit.Logger(t, &idleLog)})
		idle.StopNow()
		require.NotContains(t, idleLog.String(), "cancelling")

		p := newBlockingProvider()
		busy := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, Logger: testkit.Logger(t, &busyLog)})
		b.admit(t, "s", "m1", "first")
		_, err := busy.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		busy.StopNow()
		require.Contains(t, busyLog.String(), "hard stop; cancelling running turns")
		require.Contains(t, busyLog.String(), "runs=1")
		// The cancellation is the stop's, not a failure to report.
		require.NotContains(t, busyLog.String(), "level=ERROR")
	})

	// The executor's lifecycle is every service's (internal/startstop):
	// a wake before Start or after Stop is refused, a stopped executor
	// starts again and runs what waits, and the end of Start's ctx is a
	// hard stop.
	t.Run("StartAndStopAsEveryService", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims})
		require.NoError(t, err)
		t.Cleanup(e.StopNow)
		b.admit(t, "s", "m1", "first")
		_, err = e.Wake(ctx, "s", 0)
		require.ErrorIs(t, err, executor.ErrStopped, "a wake before Start")
		require.False(t, e.WakeLocal("s", 0, []byte("w")), "a local wake before Start")

		require.NoError(t, e.Start(ctx))
		require.ErrorIs(t, e.Start(ctx), startstop.ErrStarted)
		e.Stop()
		_, err = e.Wake(ctx, "s", 0)
		require.ErrorIs(t, err, executor.ErrStopped, "a wake after Stop")

		require.NoError(t, e.Start(ctx), "Start after Stop")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m1"), "the restarted executor runs what waits")

		p := newBlockingProvider()
		started, cancel := context.WithCancel(ctx)
		h := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p})
		h.Stop()
		require.NoError(t, h.Start(started))
		b.admit(t, "s2", "m2", "second")
		_, err = h.Wake(ctx, "s2", 0)
		require.NoError(t, err)
		<-p.started
		cancel() // the ctx of Start ends: the running turn is cancelled, not waited for (the gate stays shut)
		require.Eventually(t, func() bool {
			_, err := h.Wake(ctx, "s3", 0)
			return errors.Is(err, executor.ErrStopped) && b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's2'`) == 0
		}, 20*time.Second, 10*time.Millisecond, "the end of Start's ctx stops the executor hard, and the turn releases its claim")
	})

	t.Run("MaxSessionsAppliesBackpressure", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 5*time.Second, 1)
		b.admit(t, "s1", "m1", "one")
		b.admit(t, "s2", "m2", "two")
		done1, err := e.Wake(ctx, "s1", 0)
		require.NoError(t, err)
		<-p.started
		blocked, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = e.Wake(blocked, "s2", 0)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the only slot is busy: Wake waits")
		var done2 <-chan struct{}
		woke := make(chan struct{})
		go func() {
			defer close(woke)
			done2, err = e.Wake(ctx, "s2", 0)
		}()
		close(p.gate)
		wait(t, done1)
		wait(t, woke)
		require.NoError(t, err)
		wait(t, done2)
		require.Equal(t, 1, b.answered(t, "m2"))
	})

	t.Run("WakesDuringARunCoalesce", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 5*time.Second, 0)
		b.admit(t, "s", "m1", "one")
		first, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		var dones []<-chan struct{}
		for range 5 {
			d, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			dones = append(dones, d)
		}
		for _, d := range dones {
			require.Equal(t, first, d, "one run, one done channel")
		}
		close(p.gate)
		wait(t, first)
		require.Equal(t, int32(1), p.calls.Load())
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE session_id = 's' AND fencing_token = 1`),
			"the successor run found nothing waiting and wrote no claim")
	})

	t.Run("LongTurnKeepsItsClaimAcrossLeases", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		p := newBlockingProvider()
		e := b.executor(t, "a", p, 600*time.Millisecond, 0)
		b.admit(t, "s", "m1", "slow")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-p.started
		// Hold the turn until the claim has been renewed well past two leases.
		var acquired time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT acquired_at FROM claims WHERE session_id = 's'`).Scan(&acquired))
		require.Eventually(t, func() bool {
			var renewedFor time.Duration
			var live bool
			err := b.pool.QueryRow(ctx, `SELECT renewed_at - acquired_at, expires_at > now() FROM claims WHERE session_id = 's'`).Scan(&renewedFor, &live)
			return err == nil && live && renewedFor > 1500*time.Millisecond
		}, 20*time.Second, 20*time.Millisecond)
		close(p.gate)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m1"))
	})
}

// A plain prompt's claim commits with its first turn, straight in phase
// unknown. When the session changes between the executor's read and that
// claim (here a steer is admitted), the claim is refused and the executor
// claims first (phase ready) from a fresh read: the steer, admitted before
// the claim, still jumps the queue.
//
// It catches: a claim taken on a stale read (the queued prompt would run
// first, or the steer be lost), a refused claim that drops the wake
// (nothing runs), and the merged claim not taken at all on the plain path.
func TestClaimTakenAsRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("ChangedSinceRead=%v", changed), func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			phases := &phaseLog{}
			nudges := &nudgeLog{}
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a", OnPhaseFunc: phases.add})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, OnCommitFunc: nudges.onCommit(b)})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "queued", "first in line")
			var once sync.Once
			before := b.count(t, `SELECT max(id) FROM outbox`)
			executor.SetAfterRead(e, func() {
				if changed {
					once.Do(func() {
						_, err := b.admitter.Admit(ctx, []admission.Incoming{{Prompt: envelope.Prompt{
							MessageID: "steer", SessionID: "s", Text: "steer", Delivery: envelope.DeliverySteer}}})
						require.NoError(t, err)
						before = b.count(t, `SELECT max(id) FROM outbox`) // the executor's commits follow
					})
				}
			})
			done, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)

			require.Equal(t, 1, b.answered(t, "queued"))
			got := phases.get()
			if !changed {
				require.Equal(t, []ledger.Phase{ledger.PhaseUnknown, ledger.PhaseSafe}, got,
					"the claim committed with the first turn: never ready")
				return
			}
			require.Equal(t, 1, b.answered(t, "steer"))
			require.Equal(t, ledger.PhaseReady, got[0], "refused as read, then claimed first: %v", got)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs s, inputs q
				WHERE s.message_id = 'steer' AND q.message_id = 'queued' AND s.promotion_seq < q.promotion_seq`),
				"the steer admitted before the claim was promoted first")
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released when idle")
			// The promotions after a claim taken first commit through the
			// executor's plain write, and nudge the relay as every commit does.
			requireNudgedAfterEachCommit(t, b, before, nudges.get())
		})
	}
}

// A partition revoked while a plain prompt's claim commits with its first
// turn: that turn is under way (its attempt's intent is committed), so it
// runs to its answer, and only then does the run stop — starting no second
// turn, releasing with a wake for the prompt still waiting.
//
// It catches: a first turn released unrun on a stop (its prompt left
// promoted and never answered, out of recovery's and redrive's sight).
func TestFirstTurnRunsWhenRevokedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	e := b.executor(t, "a", nil, 5*time.Second, 0)
	b.admit(t, "s", "first", "one")
	b.admit(t, "s", "second", "two")
	var once sync.Once
	executor.SetAfterRead(e, func() { once.Do(func() { e.Revoke([]int32{0}) }) })
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)

	require.Equal(t, 1, b.answered(t, "first"), "the first turn ran to its answer")
	require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE status = 'pending'`), "no turn left half-way")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = 'second' AND promotion_seq IS NOT NULL`),
		"no second turn after the stop")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 's'
		AND convert_from(payload, 'UTF8')::jsonb ->> 'reason' = 'released'`), "with a wake for the prompt still waiting")
}

// Not parallel: the stress test's leak check counts every goroutine.
func TestExecutorStartStop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		b := setupExec(t)
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims})
		require.NoError(t, err)
		startstoptest.Stress(t, e)
	})

	// Starts and stops racing with wakes: every prompt is still answered
	// once, and no claim is left. (Graceful stops only: a hard stop may
	// cut a promotion off and leave its claim to recovery, as designed.)
	t.Run("StopsRacingWithWakes", func(t *testing.T) {
		ctx := context.Background()
		b := setupExec(t)
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims})
		t.Cleanup(e.StopNow)
		const sessions = 20
		for i := range sessions {
			b.admit(t, fmt.Sprintf("s%d", i), fmt.Sprintf("m%d", i), "hello")
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 30 {
				e.Stop()
				if err := e.Start(ctx); err != nil {
					t.Errorf("Start: %v", err)
				}
			}
		})
		for w := range 3 {
			wg.Go(func() {
				for i := range 60 {
					_, err := e.Wake(ctx, fmt.Sprintf("s%d", (i+w)%sessions), 0)
					if err != nil && !errors.Is(err, executor.ErrStopped) {
						t.Errorf("Wake: %v", err)
					}
				}
			})
		}
		wg.Wait()
		require.Eventually(t, func() bool {
			for i := range sessions {
				if b.answered(t, fmt.Sprintf("m%d", i)) == 0 {
					done, err := e.Wake(ctx, fmt.Sprintf("s%d", i), 0)
					require.NoError(t, err)
					<-done
				}
			}
			return b.count(t, `SELECT count(*) FROM claims`) == 0
		}, 30*time.Second, 20*time.Millisecond)
		for i := range sessions {
			require.Equal(t, 1, b.answered(t, fmt.Sprintf("m%d", i)), "m%d answered once", i)
		}
	})
}

// A local wake (hint.go) starts the session when a slot is free and hands
// its completion to the wake from Kafka that follows; with every slot busy
// it declines and starts nothing, and that wake does the work.
func TestWakeLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	p := newBlockingProvider()
	e := b.executor(t, "a", p, 5*time.Second, 1)
	b.admit(t, "s", "m1", "first")
	b.admit(t, "t", "m2", "second")

	require.True(t, e.WakeLocal("s", 3, []byte("wake-s")), "a free slot: accepted")
	require.Equal(t, "m1", <-p.started)
	_, ok := e.TakeLocal([]byte("wake-s"), 4)
	require.False(t, ok, "another partition's wake is not this one")
	done, ok := e.TakeLocal([]byte("wake-s"), 3)
	require.True(t, ok, "the wake from Kafka takes the local run's completion")

	require.False(t, e.WakeLocal("t", 3, []byte("wake-t")), "the one slot is busy: declined")
	_, ok = e.TakeLocal([]byte("wake-t"), 3)
	require.False(t, ok)
	require.True(t, e.WakeLocal("s", 3, []byte("wake-s2")), "a running session coalesces the wake")

	close(p.gate)
	wait(t, done)
	require.Equal(t, 1, b.answered(t, "m1"))
	require.Zero(t, b.answered(t, "m2"), "the declined wake started nothing")
	tDone, err := e.Wake(ctx, "t", 3)
	require.NoError(t, err)
	wait(t, tDone)
	require.Equal(t, 1, b.answered(t, "m2"))
}

// A turn that ends with nothing waiting releases its claim once, with no
// wake: only a release on stop announces the session to its next owner.
// The relay is nudged after every commit of the turn that wrote outbox
// rows, on the plain path and on a tool step's.
func TestIdleReleaseWritesNoWake(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, text string }{
		{"Plain", "first"},
		{"ToolStep", "/tool quick {}"},
		{"ProviderFails", "/fail"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setupExec(t)
			reg, _ := quickTool(t, tools.SideEffecting)
			var nudges atomic.Int32
			var logs testkit.LogBuffer
			// What each nudge saw: the newest outbox row of the session.
			var seen []int
			var seenMu sync.Mutex
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Logger: testkit.Logger(t, &logs), Tools: reg,
				OnCommitFunc: func() {
					nudges.Add(1)
					var id int
					_ = b.pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM outbox WHERE key = 's'`).Scan(&id)
					seenMu.Lock()
					seen = append(seen, id)
					seenMu.Unlock()
				}})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", c.text)
			before := b.count(t, `SELECT max(id) FROM outbox`)
			done, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnCompleted)+testkit.CountEvents(t, b.pool, "s", envelope.EventTurnFailed))
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's'`))
			require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE key = 's' AND topic = 'wakes' AND id > $1`, before),
				"no wake after the admission's")
			// now() is the transaction's start: one created_at per commit.
			commits := b.count(t, `SELECT count(DISTINCT created_at) FROM outbox WHERE key = 's' AND id > $1`, before)
			require.GreaterOrEqual(t, commits, map[string]int{"Plain": 2, "ToolStep": 4, "ProviderFails": 2}[c.name], "the turn's commits that wrote events")
			require.GreaterOrEqual(t, int(nudges.Load()), commits, "a nudge after each commit that wrote outbox rows")
			seenMu.Lock()
			requireNudgedAfterEachCommit(t, b, before, seen)
			seenMu.Unlock()
			if c.name != "ProviderFails" {
				require.NotContains(t, logs.String(), "level=ERROR")
				require.NotContains(t, logs.String(), "level=WARN")
			}
		})
	}
}

// nudgeLog is an OnCommitFunc that records, for each nudge, the newest
// outbox row of session s it saw.
type nudgeLog struct {
	mu   sync.Mutex
	seen []int
}

func (n *nudgeLog) onCommit(b *execBundle) func() {
	return func() {
		var id int
		_ = b.pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM outbox WHERE key = 's'`).Scan(&id)
		n.mu.Lock()
		n.seen = append(n.seen, id)
		n.mu.Unlock()
	}
}

func (n *nudgeLog) get() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.seen)
}

// requireNudgedAfterEachCommit checks that each commit of session s's
// outbox rows after row before (now() is the transaction's start: one
// created_at per commit) was followed by a nudge before the next commit:
// one that saw its rows and none of the next commit's.
func requireNudgedAfterEachCommit(t *testing.T, b *execBundle, before int, seen []int) {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT min(id), max(id) FROM outbox WHERE key = 's' AND id > $1 GROUP BY created_at ORDER BY min(id)`, before)
	require.NoError(t, err)
	type span struct{ First, Last int }
	spans, err := pgx.CollectRows(rows, pgx.RowToStructByPos[span])
	require.NoError(t, err)
	require.NotEmpty(t, spans)
	for i, sp := range spans {
		nudged := slices.ContainsFunc(seen, func(id int) bool {
			return id >= sp.Last && (i == len(spans)-1 || id < spans[i+1].First)
		})
		require.True(t, nudged, "no nudge after the commit of outbox rows %d to %d (nudges saw %v)", sp.First, sp.Last, seen)
	}
}

// A wake that arrives after a run's last look for input, while the run
// is ending, makes the run look again: its prompt, admitted after the
// run released the claim, is answered before the wake's channel closes.
// The run is held in that window by its own log line ("claim released;
// session idle", logged between the release and the run's end).
func TestWakeAtTheEndOfARunIsNotLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	h := &holdAt{Handler: slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}),
		msg: "claim released; session idle", once: &sync.Once{}, reached: make(chan struct{}), proceed: make(chan struct{})}
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Logger: slog.New(h)})
	t.Cleanup(e.StopNow)
	b.admit(t, "s", "m1", "first")
	first, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	select {
	case <-h.reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the run never released its claim")
	}
	require.Equal(t, 1, b.answered(t, "m1"))
	b.admit(t, "s", "m2", "second")
	second, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	close(h.proceed)
	wait(t, second)
	wait(t, first)
	require.Equal(t, 1, b.answered(t, "m2"), "the wake that came while the run ended ran its prompt")
}

// holdAt is a log handler that holds the first record with message msg
// until proceed closes, saying so on reached.
type holdAt struct {
	slog.Handler
	msg              string
	once             *sync.Once
	reached, proceed chan struct{}
}

func (h *holdAt) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() {
			close(h.reached)
			<-h.proceed
		})
	}
	return h.Handler.Handle(ctx, r)
}

func (h *holdAt) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.Handler = h.Handler.WithAttrs(attrs)
	return &c
}

func (h *holdAt) WithGroup(name string) slog.Handler {
	c := *h
	c.Handler = h.Handler.WithGroup(name)
	return &c
}

// A database failure while the executor runs is logged, naming what
// failed; the wake's run ends and the session is left to the next wake.
func TestDatabaseFailureIsLogged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testkit.DatabaseURL(t))
	require.NoError(t, err)
	var logs testkit.LogBuffer
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, pool, &executor.ExecutorConfig{Claims: claims, Logger: testkit.Logger(t, &logs)})
	t.Cleanup(e.StopNow)
	pool.Close() // every statement now fails
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Contains(t, logs.String(), `level=ERROR msg="reading session failed"`)
}

// A graceful stop lets the running turn finish, then hands the session on
// with a wake when input still waits; the relay is nudged after that
// release as after every commit with outbox rows.
func TestStopHandsOnAWaitingSessionWithAWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	p := newBlockingProvider()
	var nudges atomic.Int32
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, OnCommitFunc: func() { nudges.Add(1) }})
	b.admit(t, "s", "m1", "first")
	b.admit(t, "s", "m2", "second")
	before := b.count(t, `SELECT max(id) FROM outbox`)
	_, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	require.Equal(t, "m1", <-p.started)
	stopped := make(chan struct{})
	go func() {
		e.Stop()
		close(stopped)
	}()
	require.Eventually(t, func() bool {
		_, err := e.Wake(ctx, "s", 0)
		return errors.Is(err, executor.ErrStopped)
	}, 5*time.Second, time.Millisecond, "the stop began")
	close(p.gate)
	wait(t, stopped)
	require.Equal(t, 1, b.answered(t, "m1"), "the running turn finished")
	require.Zero(t, b.answered(t, "m2"), "no turn starts after the stop")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's'`), "released")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE key = 's' AND topic = 'wakes' AND id > $1
		AND convert_from(payload, 'UTF8')::jsonb->>'reason' = 'released'`, before), "handed on with a wake")
	commits := b.count(t, `SELECT count(DISTINCT created_at) FROM outbox WHERE key = 's' AND id > $1`, before)
	require.GreaterOrEqual(t, int(nudges.Load()), commits)
}

// A call of a tool the registry does not have fails, named, and goes back
// to the model; the turn goes on. No tool ran.
func TestUnknownToolCallFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	reg, quick := quickTool(t, tools.Idempotent)
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg})
	b.admit(t, "s", "m1", "/tool nosuch {}")
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'nosuch'
		AND state = 'failed' AND is_error AND output = 'invalid tool call: invalid call of tool "nosuch": unknown tool'`))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnCompleted))
	require.Empty(t, quick.started)
}

// refusingProvider refuses every request, asking to be tried again after
// a millisecond, and counts the requests.
type refusingProvider struct{ calls atomic.Int32 }

func (p *refusingProvider) Complete(context.Context, provider.Request) (provider.Response, error) {
	p.calls.Add(1)
	return provider.Response{}, &provider.RetryAfterError{After: time.Millisecond, Err: errors.New("busy")}
}

// A step the provider keeps refusing is sent again five times (six
// requests in all), then the turn fails with the provider's error; each
// request's outcome is reported, as is a successful one's.
func TestRefusedStepIsRetriedFiveTimes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	for _, c := range []struct {
		session  string
		provider provider.Provider
		outcomes []string
	}{
		{"s", &refusingProvider{}, slices.Repeat([]string{executor.OutcomeFailed}, 6)},
		{"t", nil, []string{executor.OutcomeSucceeded}},
	} {
		var mu sync.Mutex
		var outcomes []string
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: c.provider,
			OnAttemptFunc: func(o string, _ time.Duration) { mu.Lock(); outcomes = append(outcomes, o); mu.Unlock() }})
		t.Cleanup(e.StopNow)
		b.admit(t, c.session, c.session+"1", "hello")
		done, err := e.Wake(ctx, c.session, 0)
		require.NoError(t, err)
		wait(t, done)
		mu.Lock()
		require.Equal(t, c.outcomes, outcomes, "each request's outcome, as promptline_provider_attempts_total counts it")
		mu.Unlock()
	}
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnFailed))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'failed'`), "one attempt, retried")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, "t", envelope.EventTurnCompleted))
}

// quickTool is a registry of one tool, "quick", of class, that returns at
// once; the tool says when it ran (started).
func quickTool(t *testing.T, class tools.Class) (*tools.Registry, *stuckTool) {
	t.Helper()
	quick := newStuckTool(t, "quick", class, false)
	close(quick.release)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(quick))
	return reg, quick
}

// A wake that comes from a new assignment of a revoked partition, while the
// revoked run is ending, is a wake of this process again: the run takes
// it and runs its input. The revoked run released its claim before the
// input was admitted, so no release wrote a wake for it; the admission's
// own wake is this one.
//
// It catches: a wake that joins a stopped run after its last release,
// whose done then closes with the input unrun and no wake left for it
// anywhere (its offset committed): the prompt waits for the lost-wake
// redrive.
func TestWakeFromANewAssignmentJoinsTheRevokedRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	p := newBlockingProvider()
	e := b.executor(t, "a", p, 5*time.Second, 0)
	ending, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	executor.SetBeforeRunEnds(e, func(string) {
		once.Do(func() { close(ending); <-resume })
	})
	b.admit(t, "s", "first", "one")
	done1, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	require.Equal(t, "first", <-p.started)
	e.Revoke([]int32{0}) // the rebalance: the partition is revoked...
	close(p.gate)
	<-ending // ...the run's execution has ended and released
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))

	// ...and assigned here again: a prompt's wake arrives from it.
	b.admit(t, "s", "second", "two")
	done2, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	close(resume)
	wait(t, done1)
	wait(t, done2)

	require.Equal(t, 1, b.answered(t, "first"))
	require.Equal(t, 1, b.answered(t, "second"), "the wake's input ran before its done closed")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}
