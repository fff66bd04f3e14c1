package inspect_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/tools"
)

// everySection leaves session s with rows in every section of its report:
// a turn that asked for a tool and was allowed "always" (inputs,
// transcript, attempts, tool calls, the request and the grant), then, as
// recovery and an operator leave them, a quarantined claim, a settled
// recovery, a resolution and a release of the claim, and a prompt still
// waiting.
func everySection(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	b.admit(t, "s", "m1", `/tool echo {"text":"hi"}`)
	b.run(t, "s")
	var request string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id FROM permission_requests WHERE session_id = 's'`).Scan(&request))
	_, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: request, Reply: envelope.ReplyAlways},
		admission.Source{Topic: "permission-replies"})
	require.NoError(t, err)
	b.run(t, "s")
	b.admit(t, "s", "m2", "waiting")
	for _, sql := range []string{
		`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantined_at, quarantine_reason)
		 VALUES ('s', 'exec-q', 'dead', 9, 'ready', now(), now(), 'expires_at is not finite (infinity)')`,
		`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by, settled_at)
		 VALUES ('exec-r', 's', 'continue', 'continued', '{}', 1, 2, 'r', now())`,
		`INSERT INTO resolutions (target_id, round, target_kind, session_id, execution_id, assistant_message_id, finding, state_before,
		                          resolved_by, settled_at)
		 VALUES ('call-x', 1, 'tool_call', 's', 'exec-r', 'a-x', 'did_not_run', 'unknown', 'ops', now())`,
		`INSERT INTO quarantine_releases (kind, ref, reason, released_by) VALUES ('claim', 's', 'recovery_cap: 5 in 1h0m0s', 'ops')`,
		`UPDATE sessions SET redriven_at = now() WHERE session_id = 's'`,
		`UPDATE attempts SET next_retry_at = now() WHERE session_id = 's'`,
	} {
		_, err := b.pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
}

// The operator's read model reads a time that is not a time ('-infinity',
// 'infinity': every timestamptz column admits them, and a hand edit, a
// restore or a repair script may leave one) as such, in every column of
// every section: the report of `consumer session show` and the console,
// its JSON (the zero time, and the value in words in the *_not_finite key
// beside it) and its text (the value in words), the sessions list (paged
// across such a row), the recent recoveries and the releases. Before, the
// driver failed to read it into a time.Time, and the report failed for
// the very session an operator had to look at.
func TestTimesThatAreNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{permission: tools.Ask})
			everySection(t, b)
			testkit.SetTimesNotATime(t, b.pool, value)
			b.admit(t, "later", "m-later", "hi") // a session with times, for the list's order

			r, err := inspect.Session(ctx, b.pool, "s")
			require.NoError(t, err, "the report of a session with such a time")
			require.Equal(t, inspect.StateQuarantined, r.State)
			raw, err := json.Marshal(r)
			require.NoError(t, err)
			var doc any
			require.NoError(t, json.Unmarshal(raw, &doc))
			// Every time key holds a time (the zero time), and the key beside
			// it the value in words, as recovery's evidence has them.
			seen := map[string]bool{}
			var walk func(path string, v any)
			walk = func(path string, v any) {
				switch v := v.(type) {
				case map[string]any:
					for k, x := range v {
						if strings.HasSuffix(k, "_at") && k != "read_at" && x != nil {
							require.Equal(t, "0001-01-01T00:00:00Z", x, "%s.%s", path, k)
							require.Equal(t, value, v[k+"_not_finite"], "%s.%s_not_finite", path, k)
							seen[k] = true
							continue
						}
						if strings.HasSuffix(k, "_at_not_finite") {
							require.Contains(t, v, strings.TrimSuffix(k, "_not_finite"), "%s.%s: beside its time", path, k)
							continue
						}
						walk(path+"."+k, x)
					}
				case []any:
					for _, x := range v {
						walk(path+"[]", x)
					}
				}
			}
			walk("", doc)
			for _, k := range []string{"created_at", "last_admitted_at", "redriven_at", "admitted_at", "promoted_at", "completed_at",
				"acquired_at", "renewed_at", "expires_at", "quarantined_at", "started_at", "next_retry_at", "finished_at",
				"requested_at", "decided_at", "settled_at", "resolved_at", "asked_at", "replied_at", "resumed_at", "granted_at"} {
				require.True(t, seen[k], "no %s in the report: the test reads fewer columns than the report", k)
			}
			var back inspect.Report
			require.NoError(t, json.Unmarshal(raw, &back))
			again, err := json.Marshal(back)
			require.NoError(t, err)
			require.JSONEq(t, string(raw), string(again), "the JSON carries the whole report")

			text := render(t, r)
			require.Contains(t, text, "created        "+value+"\n")
			require.Contains(t, text, "  expires            "+value)
			require.NotContains(t, text, "0001-01-01", "no zero time stands for the value")

			var listed []string
			var after inspect.Cursor
			for range 3 {
				page, next, err := inspect.ListSessions(ctx, b.pool, inspect.ListParams{After: after, Limit: 1})
				require.NoError(t, err, "the sessions list")
				for _, row := range page {
					listed = append(listed, row.SessionID)
				}
				if next.IsZero() {
					break
				}
				after = next
			}
			want := []string{"later", "s"} // newest first: 'infinity' is newer than any time, '-infinity' older
			if value == "infinity" {
				want = []string{"s", "later"}
			}
			require.Equal(t, want, listed, "paged across the row, each session once")

			recs, _, err := inspect.RecentRecoveries(ctx, b.pool, "", inspect.RecoveryCursor{}, 10)
			require.NoError(t, err, "the recent recoveries")
			require.Len(t, recs, 1)
			rels, err := inspect.Releases(ctx, b.pool, "s")
			require.NoError(t, err, "the releases")
			require.Len(t, rels, 1)
			require.Equal(t, value, recs[0].DecidedAt.NotFinite)
			require.Equal(t, value, rels[0].ReleasedAt.NotFinite)
		})
	}
}
