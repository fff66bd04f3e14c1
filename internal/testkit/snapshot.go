package testkit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Snapshot is every row session s has in the tables a turn writes, as
// JSON, in a stable order, less what differs between two sessions written
// alike: sequence numbers (outbox IDs, message and admission and promotion
// sequences) become their ranks within the session's rows, so order
// counts; times become their ranks within their row (two set by the same
// transaction's now() share one), so which are equal and which later
// counts; the inputs' payload hashes (of the session's name) whether they
// are set; outbox payloads are text; the columns ignore names
// ("table.column") are left out.
func Snapshot(t *testing.T, pool *pgxpool.Pool, s string, ignore ...string) string {
	t.Helper()
	var out strings.Builder
	for _, q := range []struct{ table, sql string }{
		{"sessions", `SELECT to_jsonb(x) FROM sessions x WHERE session_id = $1`},
		{"inputs", `SELECT to_jsonb(x) FROM inputs x WHERE session_id = $1 ORDER BY message_id`},
		{"claims", `SELECT to_jsonb(x) FROM claims x WHERE session_id = $1`},
		{"messages", `SELECT to_jsonb(x) FROM messages x WHERE session_id = $1 ORDER BY message_id`},
		{"message_parts", `SELECT to_jsonb(x) FROM message_parts x JOIN messages m USING (message_id) WHERE m.session_id = $1 ORDER BY message_id, idx`},
		{"attempts", `SELECT to_jsonb(x) FROM attempts x WHERE session_id = $1 ORDER BY attempt_id`},
		{"outbox", `SELECT to_jsonb(x) || jsonb_build_object('payload', convert_from(payload, 'UTF8')) FROM outbox x
			WHERE key = $1 AND convert_from(payload, 'UTF8') NOT LIKE '%admitted%' ORDER BY id`}, // admission's rows carry its clock
	} {
		kinds := map[string]string{}
		rows, err := pool.Query(context.Background(), `SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1`, q.table)
		require.NoError(t, err)
		var col, typ string
		_, err = pgx.ForEachRow(rows, []any{&col, &typ}, func() error { kinds[col] = typ; return nil })
		require.NoError(t, err)
		require.NotEmpty(t, kinds, q.table)
		rows, err = pool.Query(context.Background(), q.sql, s)
		require.NoError(t, err)
		var all []map[string]any
		var row map[string]any
		_, err = pgx.ForEachRow(rows, []any{&row}, func() error { all = append(all, row); return nil })
		require.NoError(t, err)
		sequences := map[string][]float64{} // column → the session's values
		for _, r := range all {
			for k, v := range r {
				if f, ok := v.(float64); ok && (k == "id" || k == "seq" || strings.HasSuffix(k, "_seq")) {
					sequences[k] = append(sequences[k], f)
				}
			}
		}
		for _, r := range all {
			var times []time.Time
			for k, v := range r {
				switch {
				case slices.Contains(ignore, q.table+"."+k):
					r[k] = "ignored"
				case sequences[k] != nil && v != nil:
					r[k] = fmt.Sprintf("rank %d", rank(sequences[k], v.(float64), func(a, b float64) int { return cmp.Compare(a, b) }))
				case k == "payload_hash":
					r[k] = v != nil
				case strings.HasPrefix(kinds[k], "timestamp") && v != nil:
					at, err := time.Parse(time.RFC3339Nano, v.(string))
					require.NoError(t, err, "%s.%s", q.table, k)
					times = append(times, at)
					r[k] = at
				}
			}
			for k, v := range r {
				if at, ok := v.(time.Time); ok {
					r[k] = fmt.Sprintf("time %d", rank(times, at, func(a, b time.Time) int { return a.Compare(b) }))
				}
			}
			b, err := json.MarshalIndent(r, "", " ")
			require.NoError(t, err)
			out.WriteString(q.table + " " + string(b) + "\n")
		}
		fmt.Fprintf(&out, "%s rows: %d\n", q.table, len(all))
	}
	return out.String()
}

// rank is v's rank among the distinct values of all.
func rank[T any](all []T, v T, compare func(a, b T) int) int {
	sorted := slices.SortedFunc(slices.Values(all), compare)
	sorted = slices.CompactFunc(sorted, func(a, b T) bool { return compare(a, b) == 0 })
	i, _ := slices.BinarySearchFunc(sorted, v, compare)
	return i
}
