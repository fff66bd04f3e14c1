package ledger_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// A combined transaction of several sessions (groupCommit) whose commit's
// answer is lost may have committed: it is never sent again session by
// session (each would be written twice); every sender gets the error, as
// it would alone, and its own retry decides.
func TestGroupCommitAmbiguousIsNotResent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, proxy, ppool := proxiedPools(t, nil)
	b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "owner-a"})}
	const n = 16
	var xs []*ledger.Execution
	for i := range n {
		s := fmt.Sprintf("s%02d", i)
		b.session(t, s, 1)
		x, err := b.claims.AcquireWaiting(ctx, s, "e-"+s, nil)
		require.NoError(t, err)
		xs = append(xs, x)
	}
	// Rounds of concurrent writes until one combined transaction (the
	// statements of two sessions or more) was cut after the server had
	// committed it. The cut is chosen by what the commit holds, not by its
	// place among the round's commits: on a loaded machine any of them may
	// go alone.
	combined := func(stmts []string) bool {
		inserts := 0
		for _, s := range stmts {
			if strings.Contains(s, "INSERT INTO outbox") {
				inserts++
			}
		}
		return inserts > 1
	}
	proxy.CutAfterCommitWhere(combined)
	for round, deadline := 0, time.Now().Add(2*time.Minute); ; round++ {
		require.True(t, time.Now().Before(deadline), "no combined transaction was cut in %d rounds", round)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, x := range xs {
			wg.Go(func() {
				<-start
				errs[i] = x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
					queueRow(batch, outbox.Row{Topic: "t", Key: x.Claim().SessionID, Payload: fmt.Appendf(nil, "r%d", round)})
				})
			})
		}
		close(start)
		wg.Wait()
		require.Zero(t, b.count(t, `SELECT count(*) FROM (SELECT key, payload FROM outbox GROUP BY key, payload HAVING count(*) > 1) d`),
			"a write is committed once, never again after an ambiguous commit")
		failed := 0
		for _, err := range errs {
			if err != nil {
				require.True(t, pgdb.Transient(err), "the cut is transient: %v", err)
				failed++
			}
		}
		if proxy.Stats().AmbiguousCuts > 0 {
			require.Greater(t, failed, 1, "every sender of the cut transaction hears of it")
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM outbox WHERE payload = $1`, fmt.Appendf(nil, "r%d", round)),
				"the cut transaction committed: every write is there once")
			return
		}
	}
}

// The split decision of a failed combined transaction: only the server's
// refusal (severity ERROR: the implicit transaction rolled back) is sent
// again session by session; a terminated backend (FATAL, perhaps during
// the commit), a lost connection or a deadline may have committed.
func TestGroupCommitRolledBack(t *testing.T) {
	t.Parallel()
	pg := func(severity, localized, code string) error {
		return fmt.Errorf("sending batch: %w", &pgconn.PgError{SeverityUnlocalized: severity, Severity: localized, Code: code})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Fenced", pg("ERROR", "ERROR", "PLFEN"), true},
		{"KeyViolated", pg("ERROR", "ERROR", "23505"), true},
		{"Deadlock", pg("ERROR", "ERROR", "40P01"), true},
		{"LocalizedServer", pg("ERROR", "FEHLER", "23505"), true},
		{"OldServerWithoutUnlocalized", pg("", "ERROR", "23505"), true},
		{"TerminatedBackend", pg("FATAL", "FATAL", "57P01"), false},
		{"LocalizedFatal", pg("FATAL", "ERROR", "57P01"), false},
		{"Panic", pg("PANIC", "PANIC", "XX000"), false},
		{"ConnClosed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), false},
		{"UnexpectedEOF", fmt.Errorf("x: %w", io.ErrUnexpectedEOF), false},
		{"Deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, ledger.RolledBack(tc.err))
		})
	}
}
