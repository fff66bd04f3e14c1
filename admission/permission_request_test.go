package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestPermissionRequestWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	// setup builds a session with one tool call, c1, to ask about.
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		pool := poolWithSessions(t, "s")
		for _, q := range []string{
			`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state)
			VALUES ('e/step-1', 's', 'e', 'm1', 1, 'p', 'k', 1, '\x00', 'succeeded')`,
			`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
				input, idempotency_key, fencing_token, state)
			VALUES ('c1', 'e/step-1', 's', 'e', 0, 'mc', 'shell', 'side_effecting', '{}', 'k', 1, 'requested')`,
		} {
			_, err := pool.Exec(ctx, q)
			require.NoError(t, err)
		}
		return &testBundle{pool: pool}
	}
	insert := func(t *testing.T, b *testBundle, p *admission.InsertPermissionRequestParams) bool {
		t.Helper()
		var inserted bool
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			inserted, err = admission.InsertPermissionRequest(ctx, tx, p)
			return err
		}))
		return inserted
	}
	ask := &admission.InsertPermissionRequestParams{RequestID: "c1", SessionID: "s", CallID: "c1", Tool: "shell", Metadata: []byte(`{"input":"ls"}`)}

	t.Run("InsertPermissionRequestInsertsOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.True(t, insert(t, b, ask))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM permission_requests
			WHERE request_id = 'c1' AND session_id = 's' AND call_id = 'c1' AND tool = 'shell' AND pattern = 'shell'
			  AND metadata = '{"input":"ls"}'::jsonb AND status = 'pending'`))

		// A replied request stays as it is when the ask is retried.
		_, err := b.pool.Exec(ctx, `UPDATE permission_requests SET status = 'approved', reply = 'once' WHERE request_id = 'c1'`)
		require.NoError(t, err)
		again := *ask
		again.Metadata = []byte(`{"input":"rm"}`)
		require.False(t, insert(t, b, &again))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM permission_requests`))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM permission_requests
			WHERE request_id = 'c1' AND status = 'approved' AND metadata = '{"input":"ls"}'::jsonb`))
	})

	t.Run("MarkPermissionResumedSetsResumedAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.True(t, insert(t, b, ask))
		resume := func() time.Time {
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				return admission.MarkPermissionResumed(ctx, tx, &admission.MarkPermissionResumedParams{RequestID: "c1"})
			}))
			var at *time.Time
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT resumed_at FROM permission_requests WHERE request_id = 'c1'`).Scan(&at))
			require.NotNil(t, at, "resumed_at is set")
			return *at
		}
		first := resume()
		var moved bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT now() > $1`, first).Scan(&moved))
		require.True(t, moved, "the clock moved past the first resume")
		require.Equal(t, first, resume(), "a request resumed before keeps its time")
	})
}

// What the executor reads of an ask: its reply and the session's standing
// grants (on the pool, before a call runs), and the turn it parked (in
// the transaction that promotes the reply).
func TestPermissionRequestReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	// setup builds two sessions; s has asked about its call c1, requested
	// by the attempt of assistant message m1.
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		pool := poolWithSessions(t, "s", "other")
		for _, q := range []string{
			`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state)
			VALUES ('e/step-1', 's', 'e', 'm1', 1, 'p', 'k', 1, '\x00', 'succeeded')`,
			`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
				input, idempotency_key, fencing_token, state)
			VALUES ('c1', 'e/step-1', 's', 'e', 0, 'mc', 'shell', 'side_effecting', '{}', 'k', 1, 'requested')`,
		} {
			_, err := pool.Exec(ctx, q)
			require.NoError(t, err)
		}
		require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := admission.InsertPermissionRequest(ctx, tx, &admission.InsertPermissionRequestParams{
				RequestID: "c1", SessionID: "s", CallID: "c1", Tool: "shell", Metadata: []byte(`{}`)})
			return err
		}))
		return &testBundle{pool: pool}
	}
	reply := func(t *testing.T, b *testBundle, id string) (admission.PermissionReply, bool) {
		t.Helper()
		r, found, err := admission.ReadPermissionReply(ctx, b.pool, &admission.PermissionReplyParams{RequestID: id})
		require.NoError(t, err)
		return r, found
	}

	t.Run("ReadPermissionReplyReadsTheRequestAsItsReplyLeftIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r, found := reply(t, b, "c1")
		require.True(t, found)
		require.Equal(t, admission.PermissionReply{Status: "pending"}, r)

		_, err := b.pool.Exec(ctx, `UPDATE permission_requests SET status = 'rejected', message = 'use ls -l' WHERE request_id = 'c1'`)
		require.NoError(t, err)
		r, found = reply(t, b, "c1")
		require.True(t, found)
		require.Equal(t, admission.PermissionReply{Status: "rejected", Message: "use ls -l"}, r)

		r, found = reply(t, b, "never-asked")
		require.False(t, found, "a call never asked about has no request")
		require.Zero(t, r)
	})

	t.Run("PermissionGrantedOnlyForTheSessionsPattern", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(ctx, `INSERT INTO permission_grants (session_id, pattern, request_id) VALUES ('s', 'shell', 'c1')`)
		require.NoError(t, err)
		granted := func(session, pattern string) bool {
			t.Helper()
			// Through a transaction here, the pool above: RowQuerier takes either.
			var g bool
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				g, err = admission.PermissionGranted(ctx, tx, &admission.PermissionGrantedParams{SessionID: session, Pattern: pattern})
				return err
			}))
			return g
		}
		require.True(t, granted("s", "shell"))
		require.False(t, granted("s", "rm"), "another tool")
		require.False(t, granted("other", "shell"), "another session")
	})

	t.Run("ParkedTurnNamesTheMessageOfTheCallsAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		parked := func(request, session string) (string, bool) {
			t.Helper()
			var assistant string
			var found bool
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				assistant, found, err = admission.ParkedTurn(ctx, tx, &admission.ParkedTurnParams{RequestID: request, SessionID: session})
				return err
			}))
			return assistant, found
		}
		assistant, found := parked("c1", "s")
		require.True(t, found)
		require.Equal(t, "m1", assistant)
		_, found = parked("c1", "other")
		require.False(t, found, "a reply of another session resumes nothing")
		_, found = parked("never-asked", "s")
		require.False(t, found)
	})
}
