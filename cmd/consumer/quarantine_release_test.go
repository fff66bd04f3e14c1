package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// TestQuarantineReleaseAllFlags runs the bulk release with flags that
// do not say what to release: each must stop before the database is
// opened, exit 1 and name the flag.
func TestQuarantineReleaseAllFlags(t *testing.T) {
	t.Parallel()
	db := []string{"--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1", "--operator", "op"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"IDWithAll", []string{"claim", "s1", "--all", "--reason-contains", "x"}, "--all: takes KIND only"},
		{"AllWithoutReason", []string{"claim", "--all"}, "--all: needs --reason-contains"},
		{"EmptyReason", []string{"claim", "--all", "--reason-contains", ""}, "--reason-contains: must not be empty"},
		{"ReasonAndAnyReason", []string{"claim", "--all", "--reason-contains", "x", "--any-reason"}, "--any-reason: not with --reason-contains"},
		{"ReasonWithoutAll", []string{"claim", "s1", "--reason-contains", "x"}, "--reason-contains: only with --all"},
		{"DryRunWithoutAll", []string{"claim", "s1", "--dry-run"}, "--dry-run: only with --all"},
		{"NoIDWithoutAll", []string{"claim"}, "needs KIND and ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runOnce(t, append(append([]string{"quarantine", "release"}, tc.args...), db...)...)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "connect", "refused before the database is opened")
		})
	}
	// A fleet's environment never makes a release a bulk one.
	t.Run("AllNotFromEnvironment", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := runOnceEnv(t, []string{"PROMPTLINE_ALL=true", "PROMPTLINE_ANY_REASON=true"},
			append([]string{"quarantine", "release", "claim"}, db...)...)
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "needs KIND and ID")
	})
}

// TestQuarantineReleaseAll runs `consumer quarantine release claim --all`
// as a process over claims that `consumer recover` quarantined for real
// (an unknown phase), two of three repaired.
//
// It catches: a dry run that writes, a refused claim that stops the rest
// or exits 0, a row of another reason released, an audit missing or
// doubled, output without a line per row or the summary, JSON lines that
// do not decode, and a second run that does not release the rest.
func TestQuarantineReleaseAll(t *testing.T) {
	t.Parallel()
	pool, dbURL := testkit.Pool(t)
	db := []string{"--database-url", dbURL}
	for _, s := range []string{"s1", "s2", "s3"} {
		_, err := pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, s)
		require.NoError(t, err)
		_, err = pool.Exec(t.Context(), `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
			VALUES ($1, 'e-' || $1, 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, s)
		require.NoError(t, err)
	}
	_, stderr, code := runOnce(t, append([]string{"recover"}, db...)...)
	require.Zero(t, code, stderr)
	require.Equal(t, 3, testkit.Count(t, pool, `SELECT count(*) FROM claims WHERE quarantine_reason = 'unknown phase "bogus"'`))
	_, err := pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ('other', 1);
		INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason, quarantined_at)
		VALUES ('other', 'e', 'o', 1, 'safe', now() - interval '1 minute', 'decision failed: permission denied', now())`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id IN ('s1', 's3')`)
	require.NoError(t, err)
	bulk := append([]string{"quarantine", "release", "claim", "--all", "--reason-contains", "unknown phase",
		"--operator", "op", "--note", "phase set to safe"}, db...)

	out, stderr, code := runOnce(t, append(bulk, "--dry-run")...)
	require.Zero(t, code, stderr)
	require.Equal(t, `would release claim s1 (unknown phase "bogus")
would release claim s2 (unknown phase "bogus")
would release claim s3 (unknown phase "bogus")
would release 3 (dry run: nothing written)
`, out)
	require.Equal(t, 4, testkit.Count(t, pool, `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`), "the dry run released nothing")
	require.Zero(t, testkit.Count(t, pool, `SELECT count(*) FROM quarantine_releases`), "the dry run audited nothing")

	out, stderr, code = runOnce(t, bulk...)
	require.Equal(t, 1, code, "a refused claim exits 1: %s", stderr)
	require.Contains(t, stderr, "1 of 3 rows refused")
	require.Equal(t, `released claim s1 (unknown phase "bogus")
refused claim s2: claim s2: still fails validation: unknown phase "bogus"; repair it, then release it
released claim s3 (unknown phase "bogus")
released 2, refused 1, skipped 0
  refused claim s2: claim s2: still fails validation: unknown phase "bogus"; repair it, then release it
`, out)
	require.Equal(t, 2, testkit.Count(t, pool, `SELECT count(*) FROM quarantine_releases WHERE kind = 'claim' AND ref IN ('s1', 's3')
		AND released_by = 'op' AND note = 'phase set to safe' AND reason = 'unknown phase "bogus"'`))
	require.Equal(t, 2, testkit.Count(t, pool, `SELECT count(*) FROM quarantine_releases`), "one audit per released row")
	require.Equal(t, 1, testkit.Count(t, pool, `SELECT count(*) FROM claims WHERE session_id = 's2' AND quarantine_reason IS NOT NULL`))
	require.Equal(t, 1, testkit.Count(t, pool, `SELECT count(*) FROM claims WHERE session_id = 'other' AND quarantine_reason IS NOT NULL`))

	// Repaired, s2 goes with the next run, in JSON lines.
	_, err = pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id = 's2'`)
	require.NoError(t, err)
	out, stderr, code = runOnce(t, append(bulk, "--json")...)
	require.Zero(t, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	var row recovery.BulkReleaseRow
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &row))
	require.Equal(t, "s2", row.ID)
	require.Equal(t, recovery.KindClaim, row.Kind)
	require.Equal(t, recovery.OutcomeReleased, row.Outcome)
	require.Equal(t, `unknown phase "bogus"`, row.Reason)
	var sum struct {
		Summary *recovery.BulkReleaseSummary `json:"summary"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &sum))
	require.Equal(t, &recovery.BulkReleaseSummary{Released: 1}, sum.Summary)
	require.Equal(t, 3, testkit.Count(t, pool, `SELECT count(DISTINCT ref) FROM quarantine_releases`))
	require.Equal(t, 3, testkit.Count(t, pool, `SELECT count(*) FROM quarantine_releases`))
}
