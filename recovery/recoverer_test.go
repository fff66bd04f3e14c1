package recovery_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

func TestRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReadyIsRewokenAndThePromptRunsOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s") // died right after acquiring
		b.die(t, "s")
		wakesBefore := b.wakes(t, "s")

		p := b.pass(t)
		require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken])
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, wakesBefore+1, b.wakes(t, "s"), "one wake for the waiting input")
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1, "the prompt runs once")
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventRecoveryDecided), 1)
	})

	t.Run("SafeIsCleared", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.exec(t, `UPDATE messages SET status = 'completed' WHERE message_id = $1`, c.assistant)
		b.exec(t, `UPDATE claims SET phase = 'safe'`)
		b.die(t, "s")
		wakes := b.wakes(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionCleared])
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, wakes, b.wakes(t, "s"), "nothing waits: no wake")
	})

	t.Run("UnknownAttemptIsReconciledNeverReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.admit(t, "s", "m2", "queued behind it")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")

		p := b.pass(t)
		require.Equal(t, 1, p.Decisions[recovery.DecisionReconciled])
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'`, attempt))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND status = 'errored' AND error = $2`, c.assistant, recovery.OutcomeUnknownText))
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, envelope.FailOutcomeUnknown, failed[0].Reason)
		require.Equal(t, []string{"m1"}, failed[0].MessageIDs)
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id LIKE 'recovery-continue-%'`), "no continuation of that turn")

		// Invariant 7: the queued prompt gets its wake and runs; the
		// uncertain one is never sent again.
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1)
		require.Equal(t, "m2", rec.all()[0].Turn[0].ID)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND assistant_message_id = $1`, c.assistant))
	})

	t.Run("ContinueAdmitsOneContinuationThatSeesTheResults", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "/tool echo {\"text\": \"hi\"}")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{"text": "hi"}`})
		b.startCall(t, c, calls[0])
		b.settleCall(t, c, calls[0], "hi") // the last call settled: phase continue
		b.die(t, "s")

		p := b.pass(t)
		require.Equal(t, 1, p.Decisions[recovery.DecisionContinued])
		contID := recovery.ContinuationID("exec-s")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND delivery = 'steer' AND wake_pending`, contID))
		// Crash during recovery is covered by the transaction; a second
		// pass over the same execution finds nothing to do.
		p = b.pass(t)
		require.Empty(t, p.Decisions)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = 'exec-s'`))

		rec := &recorder{}
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		b.run(t, rec, reg, "s")
		reqs := rec.all()
		require.Len(t, reqs, 1, "exactly one continuation step")
		last := reqs[0].Messages[len(reqs[0].Messages)-1]
		require.Equal(t, "tool", last.Role)
		require.Equal(t, "hi", last.Text, "the continuation's request contains the settled tool result")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE continuation_message_id = $1 AND settled_at IS NOT NULL`, contID))
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 1)
		require.Equal(t, []string{"m1"}, completed[0].MessageIDs, "the continuation answers the original prompt")
		require.Equal(t, "tool results: echo: hi", completed[0].Text)

		// Replaying the recovery (a redelivered wake, a second pass) creates
		// nothing twice.
		b.pass(t)
		b.run(t, rec, reg, "s")
		require.Len(t, rec.all(), 1)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id LIKE 'recovery-continue-%'`))
	})

	t.Run("StartedIdempotentToolRunsAgainWithItsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "/tool echo {}")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
		b.startCall(t, c, calls[0]) // intent committed; died before the result
		b.die(t, "s")

		p := b.pass(t)
		require.Equal(t, 1, p.Decisions[recovery.DecisionContinued])
		recs := b.records(t, "s")
		require.Equal(t, recovery.RuleIdempotentToolRetry, recs[0].Rule, "the exception is recorded")

		kt := &keyTool{}
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(kt))
		b.run(t, &recorder{}, reg, "s")
		require.Equal(t, []string{calls[0].IdempotencyKey}, kt.keys, "run again once, with the same key")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'succeeded'`, calls[0].ID))
	})

	t.Run("StartedSideEffectingToolIsNeverRunAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, calls := b.diedInSideEffectingCall(t)

		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, calls[0].ID))
		dir := t.TempDir()
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewAppendLine(dir)))
		b.admit(t, "s", "m2", "next")
		b.run(t, &recorder{}, reg, "s")
		require.NoFileExists(t, dir+"/f", "the uncertain call never ran again")
	})

	// The claim of a turn that died in a tool call names the step message
	// that asked for the calls, completed with its tool_call parts. The
	// reconciled turn's turn.failed names a message the transcript holds
	// errored (invariant 12; session-events.md: "now marked as errored"),
	// as the executor's continuation answers in a message of its own: the
	// step's own stays completed, as it was answered.
	t.Run("ReconciledToolTurnNamesAnErroredMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, _ := b.diedInSideEffectingCall(t)

		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, []string{"m1"}, failed[0].MessageIDs)
		var status, turn string
		var answers []string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT status, answers, coalesce(turn_id, '') FROM messages WHERE message_id = $1`,
			failed[0].AssistantMessageID).Scan(&status, &answers, &turn))
		require.Equal(t, "errored", status, "turn.failed names %s", failed[0].AssistantMessageID)
		require.Equal(t, []string{"m1"}, answers)
		require.Equal(t, c.assistant, turn, "the turn's")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND status = 'completed'`, c.assistant),
			"the step's message stays as answered")
	})

	// One uncertain side-effecting call is enough to reconcile, whatever
	// idempotent calls started beside it: none of them is re-armed.
	t.Run("StartedSideEffectingBesideIdempotentIsReconciled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "/tool echo {}")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent", "append_line": "side_effecting"},
			map[string]string{"echo": `{}`, "append_line": `{"file": "f", "line": "x"}`})
		b.startCall(t, c, calls[0])
		b.startCall(t, c, calls[1])
		b.die(t, "s")

		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state = 'unknown'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state = 'requested'`), "nothing re-armed")
	})

	t.Run("IdempotentProviderAttemptIsSentAgainWithItsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", IdempotentProviders: []string{"keyed"}})
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "keyed")
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		require.Equal(t, recovery.RuleIdempotentProviderRetry, b.records(t, "s")[0].Rule)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'
			AND error LIKE '%sent again with the same idempotency key'`, attempt), "the uncertain attempt is settled, saying what follows it")
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1)
		require.Equal(t, attempt, rec.all()[0].IdempotencyKey, "the same key as the uncertain attempt")
	})

	t.Run("CrashDuringProviderBackoffContinuesTheTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		// The provider refused without acting (429): deferred, then death.
		require.NoError(t, c.x.Write(ctx, func(tx pgx.Tx) error { return c.x.DeferAttempt(ctx, tx, attempt, time.Second, "429") }))
		b.die(t, "s")

		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'failed'`, attempt),
			"the deferred attempt is settled: it was never sent")
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1)
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 1, "the prompt is answered")
		require.Equal(t, []string{"m1"}, completed[0].MessageIDs)
		require.Equal(t, c.assistant, completed[0].AssistantMessageID, "in the message the deferred step left pending")
		require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE status = 'pending'`))
	})

	t.Run("CrashDuringIdempotentProviderBackoffResendsWithItsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", IdempotentProviders: []string{"keyed"}})
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "keyed")
		// The provider answered 500 (it may have acted on the step); one
		// that honours keys is retried with the key, after a backoff: death.
		require.NoError(t, c.x.Write(ctx, func(tx pgx.Tx) error { return c.x.DeferAttempt(ctx, tx, attempt, time.Second, "500") }))
		b.die(t, "s")

		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		require.Equal(t, recovery.RuleIdempotentProviderRetry, b.records(t, "s")[0].Rule)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'failed'`, attempt))
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1)
		require.Equal(t, attempt, rec.all()[0].IdempotencyKey, "the step is sent again under the key it may have been acted on with")
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 1, "the prompt is answered")
		require.Equal(t, c.assistant, completed[0].AssistantMessageID, "in the message the deferred step left pending")
	})

	t.Run("SupersededIsClearedWithoutContinuing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.exec(t, `UPDATE claims SET phase = 'continue'`)
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('newer', 's', 'assistant', 'completed')`)
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionSuperseded])
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id LIKE 'recovery-continue-%'`))
		_ = c
	})

	t.Run("PoisonRowsAreQuarantinedAndTheScanMovesOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// 101 poison claims (batch + 1) expiring before one valid claim.
		for i := range 101 {
			s := fmt.Sprintf("poison-%03d", i)
			b.exec(t, `INSERT INTO sessions (session_id) VALUES ($1)`, s)
			b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
				VALUES ($1, $1 || '-exec', 'dead', 1, 'bogus', now() - interval '1 hour')`, s)
		}
		b.admit(t, "valid", "m1", "hello")
		b.acquire(t, "valid", "exec-valid")
		b.die(t, "valid")

		first := b.pass(t)
		require.Equal(t, 100, first.Decisions[recovery.DecisionQuarantined], "the first pass is bounded by the batch")
		second := b.pass(t)
		require.Equal(t, 1, second.Decisions[recovery.DecisionQuarantined])
		require.Equal(t, 1, second.Decisions[recovery.DecisionRewoken], "the valid claim is recovered within two passes")
		require.Equal(t, 101, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason = 'unknown phase "bogus"'`))
		counts, err := recovery.QuarantinedCounts(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, 101, counts[recovery.KindClaim])
		require.Empty(t, b.pass(t).Decisions, "quarantined rows are skipped by later scans")

		// An unrepaired release is refused with the reason: it would only
		// be quarantined again.
		err = recovery.Release(ctx, b.pool, recovery.KindClaim, "poison-000", &recovery.ReleaseOpts{Operator: "op", Note: "looked at it"})
		require.ErrorIs(t, err, recovery.ErrStillInvalid)
		require.ErrorContains(t, err, `unknown phase "bogus"`)
		require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = 'poison-000'`))
		require.ErrorIs(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "no-such-session", &recovery.ReleaseOpts{Operator: "op"}), recovery.ErrNotQuarantined)
		require.Empty(t, b.pass(t).Decisions)

		// Repaired (the turn had in fact completed) and released: the next
		// pass decides, in place of the quarantine record.
		b.exec(t, `UPDATE claims SET phase = 'safe' WHERE session_id = 'poison-001'`)
		require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "poison-001", &recovery.ReleaseOpts{Operator: "op", Note: "phase was safe"}))
		require.ErrorIs(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "poison-001", &recovery.ReleaseOpts{Operator: "op"}), recovery.ErrNotQuarantined)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = 'poison-001' AND released_by = 'op'`))
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionCleared])
		recs := b.records(t, "poison-001")
		require.Len(t, recs, 1)
		require.Equal(t, recovery.DecisionCleared, recs[0].Decision)
		require.Equal(t, `unknown phase "bogus"`, recs[0].QuarantineReason, "the earlier quarantine stays on record")
	})

	t.Run("ClaimPointingAtMissingMessageIsQuarantined", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s")
		b.exec(t, `UPDATE claims SET phase = 'continue', assistant_message_id = 'gone'`)
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionQuarantined])
		rows, err := recovery.ListQuarantined(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, "claim points at missing assistant message gone", rows[0].Reason)
	})

	t.Run("ContinuationOfAnotherSessionIsQuarantined", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "a", "m1", "hello")
		b.admit(t, "b", "m2", "hello")
		c := b.startTurn(t, "a", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
		b.settleCall(t, c, calls[0], "x")
		b.die(t, "a")
		b.pass(t)
		// Poison: the continuation input re-filed under session b.
		b.exec(t, `UPDATE inputs SET session_id = 'b' WHERE message_id = $1`, recovery.ContinuationID("exec-a"))
		rec := &recorder{}
		b.run(t, rec, nil, "b")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND quarantine_reason LIKE 'continuation input belongs to session a%'`, recovery.ContinuationID("exec-a")))
		require.Len(t, rec.all(), 1, "b's own prompt still ran")
		require.Equal(t, "m2", rec.all()[0].Turn[0].ID)
	})

	t.Run("TwoRecoverersOneDecision", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 20 {
			s := fmt.Sprintf("s%02d", i)
			b.admit(t, s, "m-"+s, "hello")
			b.acquire(t, s, "exec-"+s)
			b.die(t, s)
		}
		r2 := recovery.New(b.pool, &recovery.Config{OwnerID: "other-process"})
		var wg sync.WaitGroup
		var p1, p2 recovery.Pass
		var e1, e2 error
		wg.Add(2)
		go func() { defer wg.Done(); p1, e1 = b.rec.RunOnce(ctx) }()
		go func() { defer wg.Done(); p2, e2 = r2.RunOnce(ctx) }()
		wg.Wait()
		require.NoError(t, e1)
		require.NoError(t, e2)
		require.Equal(t, 20, p1.Decisions[recovery.DecisionRewoken]+p2.Decisions[recovery.DecisionRewoken])
		require.Equal(t, 20, b.count(t, `SELECT count(*) FROM recoveries`))
		require.Equal(t, 20, b.count(t, `SELECT count(DISTINCT payload) FROM outbox WHERE topic = 'session-events' AND convert_from(payload, 'UTF8')::jsonb->>'type' = 'recovery.decided'`))
	})

	t.Run("LostWakeIsRedriven", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		b.admit(t, "s", "m1", "hello")
		b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`) // the wake is lost
		require.Zero(t, b.pass(t).Redriven, "too young to redrive")
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '2 minutes'`)
		require.Equal(t, 1, b.pass(t).Redriven)
		require.Equal(t, 1, b.wakes(t, "s"))
		require.Zero(t, b.pass(t).Redriven, "at most once per redrive interval")
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1, "the prompt whose wake was deleted ran")
	})

	t.Run("ExplainSaysWhy", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")
		b.pass(t)
		var out bytes.Buffer
		recovery.Explain(&out, b.records(t, "s"))
		text := out.String()
		require.Contains(t, text, `in phase "unknown"`)
		require.Contains(t, text, "Decision: reconciled")
		require.Contains(t, text, "nothing was replayed")
		require.Contains(t, text, "exec-s/step-1 (step 1, scripted) was started")
		require.Contains(t, text, "Fencing token 1 → 2")
		out.Reset()
		recovery.Explain(&out, nil)
		require.Contains(t, out.String(), "No recovery decisions")
	})
}

var _ = ledger.PhaseReady

// Not parallel: the stress test's leak check counts every goroutine.
func TestRecovererStartStop(t *testing.T) {
	t.Run("FirstPassAtOnce", func(t *testing.T) {
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s")
		b.die(t, "s")
		decided := make(chan recovery.DecisionKind, 1)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Interval: time.Hour, RedriveAfter: time.Hour,
			OnDecisionFunc: func(d recovery.DecisionKind) { decided <- d }})
		require.NoError(t, rec.Start(context.Background()))
		defer rec.Stop()
		// With an hour between passes, only the first can have decided.
		select {
		case d := <-decided:
			require.Equal(t, recovery.DecisionRewoken, d)
		case <-time.After(15 * time.Second):
			t.Fatal("no decision from the first pass")
		}
	})

	// A pass that fails while the loop runs is logged, and the loop goes
	// on to the next pass.
	t.Run("FailedPassesAreLogged", func(t *testing.T) {
		pool, err := pgxpool.New(context.Background(), testkit.DatabaseURL(t))
		require.NoError(t, err)
		pool.Close() // every pass fails
		var logs testkit.LogBuffer
		rec := recovery.New(pool, &recovery.Config{OwnerID: "r", Interval: 10 * time.Millisecond, Logger: testkit.Logger(t, &logs)})
		require.NoError(t, rec.Start(context.Background()))
		defer rec.Stop()
		require.Eventually(t, func() bool {
			return strings.Count(logs.String(), "recovery pass failed") >= 2
		}, 15*time.Second, 5*time.Millisecond)
	})

	t.Run("Stress", func(t *testing.T) {
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s")
		b.die(t, "s") // work for the passes, which Stop may cancel midway
		startstoptest.Stress(t, recovery.New(b.pool, &recovery.Config{OwnerID: "r", Interval: time.Millisecond, RedriveAfter: time.Hour}))
	})
}

// diedInSideEffectingCall leaves session s as a process that died inside
// a side-effecting call leaves it: prompt m1's turn, its first step
// answered with the call, the call's intent committed, the lease over.
func (b *testBundle) diedInSideEffectingCall(t *testing.T) (*crashed, []ledger.CallParams) {
	t.Helper()
	b.admit(t, "s", "m1", "/tool append_line {}")
	c := b.startTurn(t, "s", "m1")
	attempt := b.beginAttempt(t, c, 1, "scripted")
	calls := b.toolStep(t, c, attempt, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{"file": "f", "line": "x"}`})
	b.startCall(t, c, calls[0])
	b.die(t, "s")
	return c, calls
}
