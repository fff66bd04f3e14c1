package testkit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// SetTimesNotATime sets every timestamptz column of every table, in every
// row where it holds a time, to value ('-infinity' or 'infinity'), as a
// hand edit, a restore or a repair script may: the column admits them and
// no writer of promptline sets them. The columns are found in the
// catalog, so a column a later migration adds is covered too. It returns
// the columns, as "table.column".
func SetTimesNotATime(tb testing.TB, pool *pgxpool.Pool, value string) []string {
	tb.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT c.table_name, c.column_name FROM information_schema.columns c
		JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
		WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' AND c.data_type = 'timestamp with time zone'
		ORDER BY 1, 2`)
	require.NoError(tb, err)
	type column struct{ Table, Name string }
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	require.NoError(tb, err)
	require.NotEmpty(tb, cols)
	names := make([]string, len(cols))
	for i, c := range cols {
		table, col := pgx.Identifier{c.Table}.Sanitize(), pgx.Identifier{c.Name}.Sanitize()
		_, err := pool.Exec(ctx, `UPDATE `+table+` SET `+col+` = $1::timestamptz WHERE `+col+` IS NOT NULL`, value)
		require.NoError(tb, err, "%s.%s", c.Table, c.Name)
		names[i] = c.Table + "." + c.Name
	}
	return names
}
