package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// TestSelectIsAnOrderedIndexScan: after a burst of marks, with the
// table's statistics not yet caught up (autovacuum off here, as it lags
// on a busy table), the planner's own choice for the relay's select is a
// bitmap scan, which reads every index entry of a marked row and its heap
// page again on every pass. In the relay's pass, after its lock
// statement, the select is an ordered scan of outbox_unpublished, which
// marks those entries dead as it passes them and stops at the batch.
func TestSelectIsAnOrderedIndexScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	for _, sql := range []string{
		`ALTER TABLE outbox SET (autovacuum_enabled = false)`,
		`INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 100000) g`,
		`UPDATE outbox SET published_at = now()`,
		`INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 500) g`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	nodes := func(tx pgx.Tx) []string {
		var plan []byte
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+selectSQL, 500, []int64{}, []string{}).Scan(&plan))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		var all []string
		var walk func(n planNode)
		walk = func(n planNode) {
			all = append(all, n.Type+" "+n.Index)
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(doc[0].Plan)
		return all
	}
	// One connection throughout, so that a setting left on it would show.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		require.Contains(t, nodes(tx), "Bitmap Index Scan outbox_unpublished",
			"the planner's own choice (if this fails, the planner changed: see lockSQL's comment)")
		return nil
	}))
	for _, lock := range []string{lockSQL, tryLockSQL} {
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, lock, RelayLockKey)
			require.NoError(t, err)
			// The second branch of the union (the batch) is the one that
			// scans; the first looks up the failing rows by ID.
			require.Equal(t, []string{"Merge Append ", "Limit ", "Index Scan outbox_unpublished", "Limit ", "Index Scan outbox_unpublished"}, nodes(tx), lock)
			return nil
		}))
	}
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		require.Contains(t, nodes(tx), "Bitmap Index Scan outbox_unpublished", "the setting ends with the pass's transaction")
		return nil
	}))
}

type planNode struct {
	Type  string     `json:"Node Type"`
	Index string     `json:"Index Name"`
	Plans []planNode `json:"Plans"`
}

// A pass's statements look rows up by an index at every size of the
// table, also in the generic plan Postgres keeps for a prepared statement
// once it chose one: a plan chosen while the outbox held a few dozen rows
// (a fresh database's first minute, before autovacuum's first analyze)
// was a scan of the whole table, and nothing re-planned it as the table
// grew: every pass then read every row (docs/benchmarks.md, "A plan
// chosen on an empty table").
func TestPassPlansAreIndexScansAtAnySize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	_, err := pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = false);
		INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 30) g`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	scans := func(tx pgx.Tx, stmt string) []string {
		var plan []byte
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE `+stmt).Scan(&plan))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		var all []string
		var walk func(n planNode)
		walk = func(n planNode) {
			if strings.HasSuffix(n.Type, "Scan") && n.Type != "CTE Scan" {
				all = append(all, n.Type+" "+n.Index)
			}
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(doc[0].Plan)
		return all
	}
	for l, lock := range []string{lockSQL, tryLockSQL} {
		for r, rows := range []int{30, 20000} {
			require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				name := fmt.Sprintf("_%d_%d", l, r)
				for _, sql := range []string{
					`SET LOCAL plan_cache_mode = force_generic_plan`,
					`PREPARE sel` + name + `(int, bigint[], text[]) AS ` + selectSQL,
					`PREPARE mark` + name + `(bigint[]) AS ` + markSQL,
				} {
					_, err := tx.Exec(ctx, sql)
					require.NoError(t, err, sql)
				}
				_, err := tx.Exec(ctx, lock, RelayLockKey)
				require.NoError(t, err)
				// The plans are made here, at this size, and kept.
				sel := scans(tx, `sel`+name+`(500, '{}', '{}')`)
				mark := scans(tx, `mark`+name+`('{1,2}')`)
				require.Equal(t, []string{"Index Scan outbox_unpublished", "Index Scan outbox_unpublished"}, sel, "%s at %d rows", lock, rows)
				require.Equal(t, []string{"Index Scan outbox_pkey"}, mark, "%s at %d rows", lock, rows)
				return nil
			}))
			_, err := conn.Exec(ctx, `INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 20000) g`)
			require.NoError(t, err)
		}
	}
}
