package pgproxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
)

func TestMain(m *testing.M) { testkit.Main(m) }

type testBundle struct {
	direct  *pgx.Conn // to the server, not through the proxy
	proxied string    // the database URL through the proxy
	proxy   *pgproxy.Proxy
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dbURL := testkit.DatabaseURL(t)
	direct, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close(context.Background()) })
	_, err = direct.Exec(t.Context(), `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	p, proxied := pgproxy.StartFor(t, dbURL)
	return &testBundle{direct: direct, proxied: proxied, proxy: p}
}

func (b *testBundle) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), b.proxied)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (b *testBundle) rows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.direct.QueryRow(t.Context(), `SELECT count(*) FROM t`).Scan(&n))
	return n
}

func TestProxy(t *testing.T) {
	t.Parallel()

	t.Run("CountsCommitsOfWritesOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connect(t)
		ctx := t.Context()
		var one int
		require.NoError(t, c.QueryRow(ctx, `SELECT 1`).Scan(&one))
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&one))
		require.NoError(t, tx.Commit(ctx), "a read-only transaction")
		require.Empty(t, b.proxy.Commits(), "reads commit nothing")

		_, err = c.Exec(ctx, `INSERT INTO t (id) VALUES ($1)`, 1) // extended protocol, autocommit
		require.NoError(t, err)
		tx, err = c.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE t SET v = v + 1 WHERE id = $1`, 1)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx)) // simple-protocol COMMIT
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 2)
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 3)
		require.NoError(t, c.SendBatch(ctx, batch).Close()) // one implicit transaction
		require.Len(t, b.proxy.Commits(), 3, "%q", b.proxy.Commits())
		require.Equal(t, 3, b.rows(t))
	})

	// The ambiguous commit, in each way a commit is sent: the server has
	// committed, the client got an error.
	for _, c := range []struct {
		name   string
		commit func(ctx context.Context, c *pgx.Conn) error
	}{
		{"Autocommit", func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, `INSERT INTO t (id) VALUES ($1)`, 1)
			return err
		}},
		{"ExplicitCommit", func(ctx context.Context, c *pgx.Conn) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO t (id) VALUES ($1)`, 1); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}},
		{"ImplicitBatch", func(ctx context.Context, c *pgx.Conn) error {
			batch := &pgx.Batch{}
			batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 1)
			batch.Queue(`UPDATE t SET v = 1 WHERE id = $1`, 1)
			return c.SendBatch(ctx, batch).Close()
		}},
	} {
		t.Run("AmbiguousCommit"+c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			conn := b.connect(t)
			// A prepared statement cached by an earlier use: the commit is
			// recognised by the Bind's statement name.
			_, err := conn.Exec(t.Context(), `INSERT INTO t (id) VALUES ($1)`, 100)
			require.NoError(t, err)
			b.proxy.CutAtCommit(2)
			require.Error(t, c.commit(t.Context(), conn), "the client never hears the answer")
			require.Equal(t, 2, b.rows(t), "the server committed")
			require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		})
	}

	// The cut chosen by what a commit holds: a lone insert goes through,
	// the batch of two is the one cut.
	t.Run("AmbiguousCommitWhere", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conn := b.connect(t)
		ctx := t.Context()
		b.proxy.CutAfterCommitWhere(func(stmts []string) bool { return len(stmts) >= 2 })
		_, err := conn.Exec(ctx, `INSERT INTO t (id) VALUES ($1)`, 1)
		require.NoError(t, err, "one statement: not the one")
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 2)
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 3)
		require.Error(t, conn.SendBatch(ctx, batch).Close(), "the client never hears the answer")
		require.Equal(t, 3, b.rows(t), "the server committed")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		again := b.connect(t)
		batch = &pgx.Batch{}
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 4)
		batch.Queue(`INSERT INTO t (id) VALUES ($1)`, 5)
		require.NoError(t, again.SendBatch(ctx, batch).Close(), "armed once")
	})

	t.Run("CutAllAndRefuse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connect(t)
		ctx := t.Context()
		b.proxy.Refuse(true)
		require.Equal(t, 1, b.proxy.CutAll())
		_, err := c.Exec(ctx, `SELECT 1`)
		require.Error(t, err, "the connection is cut")
		_, err = pgx.Connect(ctx, b.proxied)
		require.Error(t, err, "new connections are refused")
		b.proxy.Refuse(false)
		c2 := b.connect(t)
		_, err = c2.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		st := b.proxy.Stats()
		require.Equal(t, 1, st.Cut)
		require.Positive(t, st.Refused)
	})

	t.Run("StallInTxHoldsLocksPastLockTimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		_, err := b.direct.Exec(ctx, `INSERT INTO t (id) VALUES (1)`)
		require.NoError(t, err)
		c := b.connect(t)
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE t SET v = 1 WHERE id = 1`)
		require.NoError(t, err)
		b.proxy.StallNextInTx(2 * time.Second)
		stalled := make(chan error, 1)
		go func() { stalled <- tx.Commit(ctx) }()

		other, err := pgx.Connect(ctx, b.proxied)
		require.NoError(t, err)
		defer other.Close(context.Background())
		_, err = other.Exec(ctx, `SET lock_timeout = '200ms'`)
		require.NoError(t, err)
		start := time.Now()
		_, err = other.Exec(ctx, `UPDATE t SET v = 2 WHERE id = 1`)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v", err)
		require.Equal(t, "55P03", pgErr.Code, "lock_timeout behind the stalled transaction")
		require.Less(t, time.Since(start), 2*time.Second)
		require.NoError(t, <-stalled, "the stalled unit is forwarded after the stall")
		require.Equal(t, 1, b.proxy.Stats().Stalls)
	})

	t.Run("LatencyDelaysRoundTrips", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connect(t)
		b.proxy.SetLatency(50 * time.Millisecond)
		start := time.Now()
		_, err := c.Exec(t.Context(), `SELECT 1`)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "both directions delayed")
	})
}

func TestCutBeforeCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.connect(t)
	ctx := t.Context()
	b.proxy.CutBeforeCommit(func(label string) bool { return strings.Contains(label, "UPDATE t") })
	_, err := c.Exec(ctx, `INSERT INTO t (id) VALUES ($1)`, 1)
	require.NoError(t, err, "another commit goes through")
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE t SET v = 5 WHERE id = $1`, 1)
	require.NoError(t, err)
	require.Error(t, tx.Commit(ctx), "the commit is never sent")
	var v int
	require.NoError(t, b.direct.QueryRow(ctx, `SELECT v FROM t WHERE id = 1`).Scan(&v))
	require.Zero(t, v, "rolled back")
	require.Equal(t, 1, b.proxy.Stats().CutsBefore)
}
