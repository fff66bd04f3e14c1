package pgdb_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// Time reads every value a timestamptz column admits, NULL through a
// *Time, passes each back as an argument unchanged, orders them as
// Postgres does, formats and parses them, and writes its JSON as a time.
func TestTimeReadsWhatTheColumnAdmits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	at := time.Date(2026, 11, 28, 10, 0, 0, 123456000, time.UTC)
	for _, tc := range []struct {
		literal string
		want    pgdb.Time
		json    string
	}{
		{"-infinity", pgdb.Time{NotFinite: pgdb.NegativeInfinity}, `"0001-01-01T00:00:00Z"`},
		{"infinity", pgdb.Time{NotFinite: pgdb.Infinity}, `"0001-01-01T00:00:00Z"`},
		{at.Format(time.RFC3339Nano), pgdb.TimeOf(at), `"2026-11-28T10:00:00.123456Z"`},
	} {
		t.Run(tc.literal, func(t *testing.T) {
			t.Parallel()
			var got pgdb.Time
			var same bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT $1::timestamptz`, tc.literal).Scan(&got))
			require.Equal(t, tc.want, got.UTC())
			require.NoError(t, pool.QueryRow(ctx, `SELECT $1::timestamptz = $2::timestamptz`, got, tc.literal).Scan(&same))
			require.True(t, same, "passed back as it was read")
			var p *pgdb.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT $1::timestamptz`, tc.literal).Scan(&p))
			require.Equal(t, tc.want, p.UTC())

			// JSON: the time, the zero time for a value that is not one,
			// whose words go beside it.
			b, err := json.Marshal(got.UTC())
			require.NoError(t, err)
			require.JSONEq(t, tc.json, string(b))
			var back pgdb.Time
			require.NoError(t, json.Unmarshal(b, &back))
			require.Equal(t, tc.want.At, back.At.UTC())
			if tc.want.IsFinite() {
				require.Nil(t, got.NotFiniteOrNil())
			} else {
				require.Equal(t, tc.literal, *got.NotFiniteOrNil())
			}
			require.Equal(t, tc.want.Format(time.RFC3339Nano), got.UTC().String())
			parsed, err := pgdb.ParseTime(time.RFC3339Nano, got.String())
			require.NoError(t, err)
			require.Zero(t, parsed.Compare(got))
		})
	}

	var p *pgdb.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT NULL::timestamptz`).Scan(&p))
	require.Nil(t, p)
	var v pgdb.Time
	require.Error(t, pool.QueryRow(ctx, `SELECT NULL::timestamptz`).Scan(&v), "NULL is no value of a Time")

	ninf, inf := pgdb.Time{NotFinite: pgdb.NegativeInfinity}, pgdb.Time{NotFinite: pgdb.Infinity}
	order := []pgdb.Time{ninf, pgdb.TimeOf(at), pgdb.TimeOf(at.Add(time.Second)), inf}
	for i := range order {
		for j := range order {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			require.Equal(t, want, order[i].Compare(order[j]), "%s vs %s", order[i], order[j])
		}
	}
}
