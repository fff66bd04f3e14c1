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
