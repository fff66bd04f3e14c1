package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

// A result callback that fails in a combined transaction (groupCommit) is
// its own session's failure, never another's: the server committed the
// transaction, since nothing failed there, so every other session's
// statements committed and it is told so; the session whose callback
// failed is told its error (its statements committed too, and its caller
// treats the error as a write that may have landed). In the executor: a
// read queued with a claim (its waiting inputs, its transcript) whose
// rows cannot be scanned, in a flush shared with another session's claim.
// Both a
// callback's own error and a Scan that fails (which pgx otherwise carries
// on to the next statement of the batch) are covered. A statement the
// server refused is still the transaction's, even when only a callback
// hears of it (here the batch's last statement): it rolled back, and each
// session is sent again alone.
func TestGroupCommitCallbackErrorIsOnlyItsSessions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failing string // the session whose read fails: a sorts first, b last
		read    func(b *pgx.Batch)
		want    string
		refused bool // by the server: nothing of the failing session commits
	}{
		{"CallbackError", "a", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 1`).QueryRow(func(row pgx.Row) error {
				var one int
				if err := row.Scan(&one); err != nil {
					return err
				}
				return errors.New("session a's read cannot be used")
			})
		}, "session a's read cannot be used", false},
		{"ScanError", "a", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 'not a number'::text`).QueryRow(func(row pgx.Row) error {
				var n int
				return row.Scan(&n)
			})
		}, "cannot scan", false},
		// A callback that reads its result with Exec has no rows: its
		// error is still only its own.
		{"ExecCallbackError", "a", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 1`).Exec(func(pgconn.CommandTag) error {
				return errors.New("session a's command cannot be used")
			})
		}, "session a's command cannot be used", false},
		// A Scan into a pgx.RowScanner is the scanner's, as in pgx: here
		// it reads the row and then finds it cannot be used.
		{"RowScannerError", "a", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 7`).QueryRow(func(row pgx.Row) error {
				return row.Scan(&refusingScanner{})
			})
		}, "the row scanner read 7 and refused it", false},
		{"DriverBytesRefused", "b", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 'x'::text`).QueryRow(func(row pgx.Row) error {
				var b pgtype.DriverBytes
				return row.Scan(&b)
			})
		}, "cannot scan into *pgtype.DriverBytes from QueryRow", false},
		{"NoRow", "a", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 1 WHERE false`).QueryRow(func(row pgx.Row) error {
				var n int
				return row.Scan(&n)
			})
		}, pgx.ErrNoRows.Error(), false},
		{"RefusedInLastCallback", "b", func(batch *pgx.Batch) {
			batch.Queue(`SELECT 1 / 0`).QueryRow(func(row pgx.Row) error {
				var n int
				return row.Scan(&n)
			})
		}, "division by zero", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := setup(t, time.Minute)
			b.session(t, "a", 1)
			b.session(t, "b", 1)

			release := occupyFlushes(t, b)

			// Both queue behind the busy flushes, and go out as one
			// transaction once the lock is gone.
			acquired := map[string]chan error{}
			for _, s := range []string{"a", "b"} {
				acquired[s] = make(chan error, 1)
				var read func(*pgx.Batch)
				if s == tc.failing {
					read = tc.read
				}
				go func() {
					_, err := b.claims.AcquireWaiting(ctx, s, "e-"+s, read)
					acquired[s] <- err
				}()
			}
			other := map[string]string{"a": "b", "b": "a"}[tc.failing]
			require.Eventually(t, func() bool { return ledger.GroupCommitQueued(b.claims) == 2 }, 20*time.Second, 5*time.Millisecond,
				"a and b wait together for a flush")
			release()
			errFailing, errOther := <-acquired[tc.failing], <-acquired[other]
			combined, separated := ledger.GroupCommitCounts(b.claims)
			require.EqualValues(t, 1, combined, "a and b went out together")
			require.ErrorContains(t, errFailing, tc.want, "%s's own read failed", tc.failing)
			require.NoError(t, errOther, "%s's claim committed; %s's callback error is not %s's", other, tc.failing, other)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, other))
			if tc.refused {
				require.EqualValues(t, 1, separated, "the server refused the combined transaction: each sent again alone")
				require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, tc.failing),
					"the refused session's claim did not commit")
				return
			}
			require.Zero(t, separated, "nothing failed on the server: nothing is sent again")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, tc.failing),
				"the failing session's claim committed with the transaction: its error is a write that may have landed, left to recovery")
		})
	}
}

// refusingScanner is a pgx.RowScanner that reads its row's one column and
// then refuses it.
type refusingScanner struct{}

func (refusingScanner) ScanRow(rows pgx.Rows) error {
	var n int
	if err := rows.Scan(&n); err != nil {
		return err
	}
	return fmt.Errorf("the row scanner read %d and refused it", n)
}

// occupyFlushes occupies every group-commit flush of b's claims: each
// waits, with a claim of a session "blk<n>-<i>" (made here, n counting
// the calls), for the session's row, locked by a transaction on a
// connection outside the pool. Sent after it, transactions queue and go
// out together once release ends the lock (and waits for the blocked
// claims).
func occupyFlushes(t *testing.T, b *testBundle) (release func()) {
	t.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("blk%d-", occupations.Add(1))
	for i := range ledger.GroupCommitMaxInFlight {
		b.session(t, fmt.Sprintf("%s%d", prefix, i), 1)
	}
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	lock, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `SELECT 1 FROM sessions WHERE starts_with(session_id, $1) FOR UPDATE`, prefix)
	require.NoError(t, err)
	// Watched from outside the pool too: the flushes hold its
	// connections.
	watch, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { watch.Close(context.Background()) })
	waiting := func() int {
		var n int
		require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n))
		return n
	}
	// One at a time, each waiting before the next is sent: sent at once,
	// several could go out in one flush (a slow machine, the race
	// detector) and leave a flush free.
	blocked := make(chan error, ledger.GroupCommitMaxInFlight)
	for i := range ledger.GroupCommitMaxInFlight {
		go func() {
			_, err := b.claims.AcquireWaiting(ctx, fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("e-%s%d", prefix, i), nil)
			blocked <- err
		}()
		require.Eventually(t, func() bool { return waiting() >= i+1 }, 20*time.Second, 10*time.Millisecond)
	}
	return func() {
		t.Helper()
		require.NoError(t, lock.Commit(ctx))
		for range ledger.GroupCommitMaxInFlight {
			require.NoError(t, <-blocked)
		}
	}
}

// occupations counts occupyFlushes' calls: each makes sessions of its own.
var occupations atomic.Int64
