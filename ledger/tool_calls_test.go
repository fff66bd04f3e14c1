package ledger_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
)

// The tool path's calls (migration 00022) through WriteCallRetried when a
// commit is cut: before it, the retry calls the function again, in a
// transaction of its own, and its row is read there; after it (the answer
// lost), the retry is refused by the write's position and the caller's
// landed check reads what the write left, as the executor's settleCall
// reads whether the call settled was the step's last.
//
// It catches: a retry that writes twice or not at all, a scan not run on
// the retry, and a settle that landed unheard taken as the step's last
// (its callback run on no row, the landed check never run): the step's
// fault point and phase report would then fire before the step's last
// call.
func TestToolPathCallsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*testBundle, *pgproxy.Proxy, *ledger.Execution, string) {
		t.Helper()
		pool, proxy, ppool := proxiedPools(t, nil)
		b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "o"})}
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		p := ledger.AttemptParams{ID: ledger.AttemptID("e1", 1), AssistantMessageID: "a1", Step: 1, Provider: "scripted",
			IdempotencyKey: "k1", RequestHash: []byte{1}}
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.BeginAttempt(ctx, tx, p) }))
		_, err := pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, execution_id, fencing_token)
			VALUES ('a1', 's', 'assistant', 'pending', 'e1', 1)`)
		require.NoError(t, err)
		calls := []ledger.CallParams{
			{ID: "c1", AttemptID: p.ID, Index: 0, ModelCallID: "m1", Tool: "echo", Class: "idempotent", Input: []byte(`{}`), IdempotencyKey: "k-c1"},
			{ID: "c2", AttemptID: p.ID, Index: 1, ModelCallID: "m2", Tool: "echo", Class: "idempotent", Input: []byte(`{}`), IdempotencyKey: "k-c2"},
		}
		require.NoError(t, x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseContinue, "a1",
			ledger.StepCallsCall(p.ID, 1, 1, "", "a1", "", []string{`{"id":"m1"}`, `{"id":"m2"}`}, calls, ledger.Events{}), nil))
		return b, proxy, x, p.ID
	}
	ev := func(topic string) ledger.Events {
		return ledger.Events{Topics: []string{topic}, Keys: []string{"s"}, Payloads: [][]byte{[]byte(`{}`)}}
	}
	// settle settles c1 as the executor's settleCall does, its last and
	// landed read from a read that succeeded only.
	settle := func(x *ledger.Execution, attempt string) (last, landedRan bool, err error) {
		landed := func(ctx context.Context, tx pgx.Tx) (bool, error) {
			s, l, err := ledger.CallSettled(ctx, tx, "c1", attempt)
			if err == nil && s {
				last, landedRan = l, true
			}
			return s, err
		}
		err = x.WriteCallRetried(ctx, ledger.RetryOpts{Landed: landed}, "", "",
			ledger.CallSettleCall("c1", attempt, ledger.CallSucceeded, "ok", false, "m1", ev("settled")),
			func(row pgx.Row) error {
				open, _, err := ledger.ScanCallCounts(row)
				if err == nil {
					last = open == 0
				}
				return err
			})
		return last, landedRan, err
	}
	start := func(x *ledger.Execution) error {
		return x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseUnknown, "", ledger.CallStartCall("c1", ev("started")), nil)
	}
	is := func(fn string) func(string) bool { return func(l string) bool { return strings.Contains(l, fn) } }

	t.Run("SettleLandedUnheardIsReadByItsLandedCheck", func(t *testing.T) {
		t.Parallel()
		b, proxy, x, attempt := setup(t)
		require.NoError(t, start(x))
		proxy.CutAfterCommit(is("promptline_call_settle"))
		last, landedRan, err := settle(x, attempt)
		require.NoError(t, err)
		require.Equal(t, 1, proxy.Stats().AmbiguousCuts)
		require.True(t, landedRan, "the retry refused by the write's position ran the landed check")
		require.False(t, last, "c2 is still requested: c1's settle is not the step's last")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'settled'`), "written once")
		require.False(t, x.Fenced())
	})

	t.Run("StartAndSettleLostBeforeCommitAreCalledAgain", func(t *testing.T) {
		t.Parallel()
		b, proxy, x, attempt := setup(t)
		proxy.CutBeforeCommit(is("promptline_call_start"))
		require.NoError(t, start(x))
		require.Equal(t, 1, proxy.Stats().CutsBefore)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = 'c1' AND state = 'started'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'started'`), "written once, by the retry")

		proxy.CutBeforeCommit(is("promptline_call_settle"))
		last, landedRan, err := settle(x, attempt)
		require.NoError(t, err)
		require.Equal(t, 2, proxy.Stats().CutsBefore)
		require.False(t, landedRan, "the write had not landed")
		require.False(t, last, "the retry's own row read: c2 is still requested")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = 'c1' AND state = 'succeeded'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = 'c1' AND role = 'tool'`))
		require.Equal(t, "continue", b.phase(t, "s"), "nothing is in flight")
	})
}
