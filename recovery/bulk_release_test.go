package recovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// bogusClaims writes an expired claim in a phase recovery does not know
// for each session and runs a pass, which quarantines them for real
// (reason `unknown phase "bogus"`).
func (b *testBundle) bogusClaims(t *testing.T, sessions ...string) {
	t.Helper()
	for _, s := range sessions {
		b.exec(t, `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, s)
		b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
			VALUES ($1, 'e-' || $1, 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, s)
	}
	b.pass(t)
	require.Equal(t, len(sessions), b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason = 'unknown phase "bogus"'`))
}

// collect is a ReleaseMatching callback that keeps the rows, and runs
// then (if not nil) after each.
func collect(rows *[]recovery.BulkReleaseRow, then func(recovery.BulkReleaseRow)) func(recovery.BulkReleaseRow) error {
	return func(r recovery.BulkReleaseRow) error {
		*rows = append(*rows, r)
		if then != nil {
			then(r)
		}
		return nil
	}
}

func outcomes(rows []recovery.BulkReleaseRow) map[string]string {
	m := map[string]string{}
	for _, r := range rows {
		m[r.ID] = r.Outcome
	}
	return m
}

// TestReleaseMatching releases quarantined claims in bulk through the
// single release's path, row by row.
//
// It catches: a refused claim that stops the rest or is released anyway,
// rows of another reason released, a page boundary that loses or repeats
// a row, a row released or quarantined again meanwhile reported as an
// error or released, audits missing or counted twice, a dry run that
// writes, and one transaction over the whole bulk.
func TestReleaseMatching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := func(o recovery.BulkReleaseOpts) *recovery.BulkReleaseOpts {
		o.Kind, o.Operator, o.Note = recovery.KindClaim, "op", "phase set"
		if o.ReasonContains == "" {
			o.ReasonContains = "unknown phase"
		}
		return &o
	}

	t.Run("RefusedAmongReleasedAcrossPages", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.bogusClaims(t, "s1", "s2", "s3", "s4", "s5")
		// Another reason: not selected.
		b.exec(t, `INSERT INTO sessions (session_id, fencing_token) VALUES ('other', 1)`)
		b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason, quarantined_at)
			VALUES ('other', 'e', 'o', 1, 'safe', now() - interval '1 minute', 'decision failed: permission denied', now())`)
		b.exec(t, `UPDATE claims SET phase = 'safe' WHERE session_id IN ('s1', 's2', 's4', 's5')`) // s3 not repaired

		var rows []recovery.BulkReleaseRow
		sum, err := recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{PageSize: 2}), collect(&rows, nil))
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{Released: 4, Refused: 1}, sum)
		require.Equal(t, map[string]string{"s1": "released", "s2": "released", "s3": "refused", "s4": "released", "s5": "released"}, outcomes(rows))
		for _, r := range rows {
			if r.ID == "s3" {
				require.Contains(t, r.Detail, `still fails validation: unknown phase "bogus"`)
			}
		}
		require.Equal(t, 4, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE kind = 'claim' AND released_by = 'op' AND note = 'phase set'
			AND reason = 'unknown phase "bogus"'`), "one audit per released row")
		require.Equal(t, 4, b.count(t, `SELECT count(DISTINCT ref) FROM quarantine_releases`))
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`), "s3 and other stay quarantined")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's3' AND quarantine_reason = 'unknown phase "bogus"'`))

		// Repaired, s3 goes with the next run; the released stay released.
		b.exec(t, `UPDATE claims SET phase = 'safe' WHERE session_id = 's3'`)
		rows = nil
		sum, err = recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{}), collect(&rows, nil))
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{Released: 1}, sum)
		require.Equal(t, 5, b.count(t, `SELECT count(*) FROM quarantine_releases`))
	})

	t.Run("DryRunWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.bogusClaims(t, "s1", "s2")
		var rows []recovery.BulkReleaseRow
		sum, err := recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{DryRun: true}), collect(&rows, nil))
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{WouldRelease: 2, DryRun: true}, sum)
		require.Equal(t, map[string]string{"s1": "would_release", "s2": "would_release"}, outcomes(rows))
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases`))
	})

	// While the bulk handles s1, someone releases s2 and someone else
	// releases s3, which the next pass quarantines again (still unknown
	// phase): both were listed before; neither is the bulk's to release.
	t.Run("ReleasedOrQuarantinedAgainMeanwhileIsSkipped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.bogusClaims(t, "s1", "s2", "s3", "s4")
		b.exec(t, `UPDATE claims SET phase = 'safe' WHERE session_id IN ('s1', 's2', 's4')`)
		var rows []recovery.BulkReleaseRow
		sum, err := recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{}), collect(&rows, func(r recovery.BulkReleaseRow) {
			if r.ID != "s1" {
				return
			}
			require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "s2", &recovery.ReleaseOpts{Operator: "someone"}))
			b.exec(t, `UPDATE claims SET quarantine_reason = NULL, quarantined_at = NULL WHERE session_id = 's3'`)
			b.pass(t) // quarantines s3 again, decides s2
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's3' AND quarantine_reason IS NOT NULL`))
		}))
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{Released: 2, Skipped: 2}, sum)
		require.Equal(t, map[string]string{"s1": "released", "s2": "skipped", "s3": "skipped", "s4": "released"}, outcomes(rows))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's3' AND quarantine_reason IS NOT NULL`),
			"quarantined again after the bulk began: not released by it")
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = 's3'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = 's2'`), "someone's audit only")
	})

	// Each row commits on its own, under its session's lock: while the
	// bulk waits for s2's session, s1's release is committed and audited.
	t.Run("OneTransactionPerRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.bogusClaims(t, "s1", "s2")
		b.exec(t, `UPDATE claims SET phase = 'safe'`)
		release := b.holdSession(t, "s2")
		done := make(chan error, 1)
		go func() {
			_, err := recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{}), func(recovery.BulkReleaseRow) error { return nil })
			done <- err
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the bulk waits for s2's session row")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = 's1'`), "s1 committed before s2 is locked")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's2' AND quarantine_reason IS NOT NULL`))
		release()
		require.NoError(t, <-done)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM quarantine_releases`))
	})

	// A released input that waits gets its wake, as from a single release.
	t.Run("ReleasedInputIsWoken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 3 {
			s, m := fmt.Sprintf("s%d", i), fmt.Sprintf("m%d", i)
			b.admit(t, s, m, "hello")
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'topic missing', quarantined_at = now() WHERE message_id = $1`, m)
		}
		b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
		var rows []recovery.BulkReleaseRow
		sum, err := recovery.ReleaseMatching(ctx, b.pool, &recovery.BulkReleaseOpts{Kind: recovery.KindInput, ReasonContains: "topic", Operator: "op"},
			collect(&rows, nil))
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{Released: 3}, sum)
		for i := range 3 {
			require.Equal(t, 1, b.wakes(t, fmt.Sprintf("s%d", i)))
		}
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE kind = 'input'`))
	})

	// A stop (an interrupt) between rows leaves what was released released
	// and audited; the next run releases the rest.
	t.Run("StoppedThenRunAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.bogusClaims(t, "s1", "s2", "s3")
		b.exec(t, `UPDATE claims SET phase = 'safe'`)
		stopCtx, stop := context.WithCancel(ctx)
		defer stop()
		sum, err := recovery.ReleaseMatching(stopCtx, b.pool, opts(recovery.BulkReleaseOpts{}), func(recovery.BulkReleaseRow) error {
			stop()
			return nil
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, sum.Released)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases`))
		sum, err = recovery.ReleaseMatching(ctx, b.pool, opts(recovery.BulkReleaseOpts{}), func(recovery.BulkReleaseRow) error { return nil })
		require.NoError(t, err)
		require.Equal(t, recovery.BulkReleaseSummary{Released: 2}, sum)
		require.Equal(t, 3, b.count(t, `SELECT count(DISTINCT ref) FROM quarantine_releases`))
	})
}
