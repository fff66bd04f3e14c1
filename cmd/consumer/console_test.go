package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
)

// consoleData is a database filled by real consumer processes: a session
// whose turn was reconciled after a SIGKILL with its provider attempt's
// intent committed, a prompt containing markup, and a claim recovery
// quarantined.
type consoleData struct {
	b           *testBundle
	reconciled  string // the session of the uncertain turn
	hostile     string // the session of the prompt with <script>
	quarantined string // the session of the quarantined claim
}

const consoleHostileText = `<script>document.title="pwned"</script> look`

func makeConsoleData(t *testing.T) *consoleData {
	t.Helper()
	b := setup(t)
	d := &consoleData{b: b, reconciled: "s-console-intent", hostile: "s-console-script", quarantined: "s-console-bogus"}
	first := prompt(d.reconciled, "first")
	crashing := b.start(t, "consumer-1", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))

	b.start(t, "consumer-2", "", "--lease", "1s", "--recovery-interval", "300ms")
	failed := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	hostile := prompt(d.hostile, consoleHostileText)
	b.send(t, hostile)
	b.events.waitTurn(t, hostile.MessageID)

	// A claim recovery quarantines: expired, in a phase it does not know.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, d.quarantined)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ($1, 'e-bogus', 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, d.quarantined)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason IS NOT NULL`, d.quarantined) == 1
	}, 30*time.Second, 50*time.Millisecond, "recovery quarantines the bogus claim")
	return d
}

const consoleToken = "console-test-token-0123456789"

// startConsole runs `consumer console` with a token file and returns its
// base URL.
func (d *consoleData) startConsole(t *testing.T) string {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(consoleToken+"\n"), 0o600))
	p := startProc(t, "console", "", "console", "--addr", "127.0.0.1:0", "--database-url", d.b.dbURL, "--console-token-file", tokenFile)
	addr := p.waitLog(t, "console serving", 30*time.Second)["addr"].(string)
	return "http://" + addr
}

func consoleGet(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+consoleToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestConsoleAfterCrash: `consumer console` over a database that real
// consumers wrote, one of them SIGKILLed with a provider attempt's intent
// committed: the session page shows the unknown attempt on the timeline
// and recovery's reconcile decision with the fencing token before and
// after, in recovery explain's words; the quarantine page lists the
// claim recovery quarantined; a prompt's markup renders as text.
func TestConsoleAfterCrash(t *testing.T) {
	t.Parallel()
	d := makeConsoleData(t)
	base := d.startConsole(t)

	resp, err := http.Get(base + "/sessions")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "/login", resp.Request.URL.Path, "without the token: the login form")

	code, body := consoleGet(t, base+"/session?id="+d.reconciled)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `class="attempt unknown"`, "the timeline shows the uncertain attempt")
	require.Contains(t, body, "attempt unknown")
	require.Regexp(t, `reconciled · token \d+→\d+`, body, "the recovery decision on the timeline")
	require.Contains(t, body, "Decision: reconciled — a provider request or a side-effecting tool call may have been acted on")
	require.Contains(t, body, "outcome unknown after restart")

	_, body = consoleGet(t, base+"/sessions?state=quarantined")
	require.Contains(t, body, `href="/session?id=`+d.quarantined+`"`)
	require.NotContains(t, body, `href="/session?id=`+d.reconciled+`"`)
	_, body = consoleGet(t, base+"/quarantine")
	require.Contains(t, body, "<td>claim</td><td>"+d.quarantined+"</td>")
	_, body = consoleGet(t, base+"/recovery?decision=reconciled")
	require.Contains(t, body, `href="/session?id=`+d.reconciled+`"`)

	_, body = consoleGet(t, base+"/session?id="+d.hostile)
	require.NotContains(t, body, "<script>")
	require.Contains(t, body, "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt; look")
	require.False(t, strings.Contains(body, consoleHostileText))
}
