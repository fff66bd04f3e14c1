package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// docs/design.md, invariant 13: a promotion the server refused (a
// deadlock, a serialization failure, a lock not granted in time) certainly
// did not commit, so the executor promotes again in place. Left to expire
// instead, the claim would hold the session for a whole lease and then be
// recovered, a second decision for one reply (seen once as a flaky
// TestRecoveryAfterClaimAcquire: a deadlock at "setting phase continue").
// An error that leaves the commit in doubt is retried too, under the
// write's position (ledger/retry.go).
//
// The refusal is injected by a trigger on the promotion's own UPDATE of the
// reply's input row, raised once: a sequence counts the tries, as a
// sequence's nextval is not rolled back with the transaction.
func TestPromotionRetriedAfterARefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	park := func(t *testing.T, code string) (*execBundle, *executor.Executor, chan string) {
		return parkedReply(t, refuseOnce("promotion", code, `BEFORE UPDATE OF promotion_seq ON inputs
			FOR EACH ROW WHEN (OLD.promotion_seq IS NULL AND NEW.promotion_seq IS NOT NULL)`))
	}
	tries := func(t *testing.T, b *execBundle) int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM promotion_tries`).Scan(&n))
		return n
	}

	for _, code := range []string{"40P01", "40001", "55P03"} {
		t.Run("Refused"+code, func(t *testing.T) {
			t.Parallel()
			b, e, runs := park(t, code)
			done, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 2, tries(t, b), "refused once, then promoted")
			require.Len(t, runs, 1, "the approved call ran once")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'
				AND convert_from(payload, 'UTF8')::jsonb @> '{"type": "turn.completed", "message_ids": ["m1"]}'`), "the resumed turn completed")
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim was released, not left to expire")
		})
	}

	// 40003 (statement_completion_unknown) leaves the outcome in doubt.
	// The promotion is retried all the same (ledger.WriteRetried), where
	// it was left to recovery before: the retry keeps the write's
	// position, so that a first try that did commit refuses it as applied
	// (TestWriteAfterDispatchRetried/PermissionResumeCommittedButUnheard
	// shows that case). Here the first try certainly rolled back (the
	// trigger raised), and the retry promotes.
	t.Run("InDoubtIsRetried", func(t *testing.T) {
		t.Parallel()
		b, e, runs := park(t, "40003")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 2, tries(t, b), "in doubt once, then promoted")
		require.Len(t, runs, 1, "the approved call ran once")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'
			AND convert_from(payload, 'UTF8')::jsonb @> '{"type": "turn.completed", "message_ids": ["m1"]}'`), "the resumed turn completed")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim was released, not left to expire")
	})
}

// The same for the intent of a turn's second step, written after the
// first step's tool call ran: refused once, it is written again, under the
// same attempt ID, and the turn completes without waiting for recovery.
func TestStepIntentRetriedAfterARefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	runs := make(chan string, 4)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(countingEcho{Tool: tools.NewEcho(), runs: runs}))
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "p"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg})
	t.Cleanup(e.StopNow)
	_, err := b.pool.Exec(ctx, refuseOnce("intent", "40P01", `BEFORE INSERT ON attempts
		FOR EACH ROW WHEN (NEW.step = 2)`))
	require.NoError(t, err)

	b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	var tries int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT last_value FROM intent_tries`).Scan(&tries))
	require.Equal(t, 2, tries, "refused once, then written")
	require.Len(t, runs, 1, "the call ran once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'
		AND convert_from(payload, 'UTF8')::jsonb @> '{"type": "turn.completed", "message_ids": ["m1"]}'`), "the turn completed")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim was released, not left to expire")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM attempts`), "two attempts")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM attempts
		WHERE state = 'succeeded' AND step IN (1, 2) AND attempt_id = execution_id || '/step-' || step`),
		"numbered 1 and 2 (the refused try's ID reused), both succeeded")
}

// A plain prompt's claim commits with its first turn (claim-as-read);
// refused by the server, nothing committed, and the executor claims first
// from a fresh read (as after a stale read) and answers the prompt in the
// same run, instead of dropping the wake and leaving the prompt to the
// lost-wake redrive.
func TestRefusedClaimWithFirstTurnClaimsFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	e := b.executor(t, "p", scripted.ScriptedProvider{}, time.Minute, 0)
	_, err := b.pool.Exec(ctx, refuseOnce("claim", "40001", `BEFORE INSERT ON claims FOR EACH ROW`))
	require.NoError(t, err)
	b.admit(t, "s", "m1", "plain")

	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 2, b.count(t, `SELECT last_value FROM claim_tries`), "refused once, then claimed")
	require.Equal(t, 1, b.answered(t, "m1"), "answered in the same run")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}

// The claim taken alone (phase ready: here for a permission reply) is
// taken again when the server refuses it.
func TestRefusedClaimTakenAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, e, runs := parkedReply(t, refuseOnce("claim", "55P03", `BEFORE INSERT ON claims FOR EACH ROW`))
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 2, b.count(t, `SELECT last_value FROM claim_tries`), "refused once, then claimed")
	require.Len(t, runs, 1, "the approved call ran once")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE promotion_seq IS NULL`), "the reply was acted on")
}

// parkedReply parks a turn on a permission ask, admits its approval, then
// runs inject (the trigger that refuses a write) before returning the
// executor that will act on the reply, and the channel of the tool's runs.
func parkedReply(t *testing.T, inject string) (*execBundle, *executor.Executor, chan string) {
	t.Helper()
	return parkedReplyLease(t, time.Minute, inject)
}

// parkedReplyLease is parkedReply with the claims' lease.
func parkedReplyLease(t *testing.T, lease time.Duration, inject string) (*execBundle, *executor.Executor, chan string) {
	t.Helper()
	ctx := context.Background()
	b := setupExec(t)
	runs := make(chan string, 4)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(countingEcho{Tool: tools.NewEcho(), runs: runs}))
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "p"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg,
		PermissionFunc: func(string) tools.Permission { return tools.Ask }})
	t.Cleanup(e.StopNow)

	b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	approvePending(t, b)
	_, err = b.pool.Exec(ctx, inject)
	require.NoError(t, err)
	return b, e, runs
}

// approvePending admits a reply "once" to the one pending permission
// request.
func approvePending(t *testing.T, b *execBundle) {
	t.Helper()
	ctx := context.Background()
	var requestID string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id FROM permission_requests WHERE status = 'pending'`).Scan(&requestID))
	out, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: requestID, Reply: envelope.ReplyOnce},
		admission.Source{Topic: "permission-replies"})
	require.NoError(t, err)
	require.Equal(t, admission.Admitted, out.Outcome)
}

// refuseOnce returns the SQL of a trigger that refuses the first write it
// fires on with SQLSTATE code, and lets every later one through. timing is
// the trigger's clause up to its EXECUTE ("BEFORE INSERT ON claims FOR EACH
// ROW ..."). The sequence name_tries counts the tries, as a sequence's
// nextval is not rolled back with the refused transaction.
func refuseOnce(name, code, timing string) string {
	return fmt.Sprintf(`
		CREATE SEQUENCE %[1]s_tries;
		CREATE FUNCTION refuse_first_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('%[1]s_tries') = 1 THEN
				RAISE EXCEPTION 'injected refusal' USING ERRCODE = '%[2]s';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_first_%[1]s %[3]s
			EXECUTE FUNCTION refuse_first_%[1]s()`, name, code, timing)
}

// A promotion the server refuses at every try (a lock held for good, a
// trigger that raises) is retried while its lease lives, once: then the
// claim is left to expire for recovery. The executor's own loop of
// refusals (retryRefused, for the claim) wrapped the ledger's, which
// retries a refusal for the lease itself; the ledger's loop ended at the
// lease's end with the refusal, the executor's began it again under a
// new position, and the keep-alive kept the fence passing: eight leases
// with the session out of recovery's reach.
func TestPromotionRefusedForGoodIsLeftWithinALease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = time.Second
	b, e, runs := parkedReplyLease(t, lease, `
		CREATE FUNCTION refuse_promotion() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'injected refusal' USING ERRCODE = '40001';
		END $$;
		CREATE TRIGGER refuse_promotion BEFORE UPDATE OF promotion_seq ON inputs
			FOR EACH ROW WHEN (OLD.promotion_seq IS NULL AND NEW.promotion_seq IS NOT NULL)
			EXECUTE FUNCTION refuse_promotion()`)

	began := time.Now()
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(20 * lease):
		t.Fatalf("the execution still retries its refused promotion after %s (lease %s)", 20*lease, lease)
	}
	took := time.Since(began)
	t.Logf("given up after %s (lease %s)", took, lease)
	require.Less(t, took, 3*lease, "a refused promotion held the session past its lease")
	require.Empty(t, runs, "the approved call did not run")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's'`), "the claim is left to expire, for recovery")
}
