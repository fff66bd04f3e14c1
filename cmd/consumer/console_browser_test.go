//go:build browser

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestConsoleInBrowser drives the console in headless Chromium (Debian's
// chromium package; CHROMIUM names another binary): log in with the token,
// filter the sessions to quarantined, open the session whose turn was
// reconciled after a SIGKILL and see the unknown attempt and the recovery
// decision on its timeline, see a prompt's <script> as text, release the
// repaired quarantined claim and see it gone. Screenshots of the session
// page and the timeline go to $BROWSER_ARTIFACTS (default: a
// promptline-browser-artifacts directory in the temporary directory),
// printed in the log.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	bin := os.Getenv("CHROMIUM")
	if bin == "" {
		var err error
		bin, err = exec.LookPath("chromium")
		require.NoError(t, err, "the browser tests need Chromium: apt-get install chromium")
	}
	artifacts := os.Getenv("BROWSER_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(os.TempDir(), "promptline-browser-artifacts")
	}
	require.NoError(t, os.MkdirAll(artifacts, 0o755))

	d := makeConsoleData(t)
	base := d.startConsole(t)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1280, 1000))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	// The first action starts the browser, on a context without a
	// deadline (it would stop the browser); every later step is bounded.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "starting Chromium")
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, chromedp.Do(sctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, chromedp.TextContent(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return v
	}

	// Log in with the token: the sessions page redirects to the form.
	do("open", chromedp.Navigate(base+"/sessions"), chromedp.WaitVisible(chromedp.ID("token")))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Contains(t, loc, "/login")
	do("login", chromedp.SendKeys(chromedp.ID("token"), consoleToken), chromedp.Click(chromedp.ID("login")))
	waitLocation(t, ctx, "/sessions")
	do("sessions", chromedp.WaitVisible(chromedp.ID("sessions")))

	// Filter to quarantined.
	do("filter", chromedp.SetValue(chromedp.ID("state"), "quarantined"), chromedp.Click(chromedp.ID("filter")))
	waitLocation(t, ctx, "/sessions?state=quarantined&q=")
	do("filtered", chromedp.WaitVisible(chromedp.ID("sessions")))
	list := text("#sessions")
	require.Contains(t, list, d.quarantined)
	require.NotContains(t, list, d.reconciled)

	// The reconciled session: its timeline shows the unknown attempt and
	// the recovery decision.
	do("session", chromedp.Navigate(base+"/session?id="+d.reconciled), chromedp.WaitVisible(chromedp.ID("timeline")))
	unknown, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll(`#timeline g.attempt.unknown`)))
	require.NoError(t, err)
	require.Len(t, unknown, 1, "one unknown provider attempt drawn")
	timeline := text("#timeline")
	require.Contains(t, timeline, "attempt unknown")
	require.Regexp(t, `reconciled · token \d+→\d+`, timeline)
	require.Contains(t, text("body"), "Decision: reconciled")
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(90))
	require.NoError(t, err)
	tlShot, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("timeline")))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(artifacts, "session.jpg"), shot, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(artifacts, "timeline.png"), tlShot, 0o644))
	t.Logf("browser artifacts (screenshots): %s", artifacts)

	// A prompt with <script> renders as text and runs nothing.
	do("hostile", chromedp.Navigate(base+"/session?id="+d.hostile), chromedp.WaitVisible(chromedp.ID("inputs")))
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	require.NotEqual(t, "pwned", title)
	require.Contains(t, text("#inputs"), `<script>document.title="pwned"</script> look`)

	// Release the quarantined claim, repaired first (the runbook).
	_, err = d.b.pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id = $1`, d.quarantined)
	require.NoError(t, err)
	do("release", chromedp.Navigate(base+"/quarantine"), chromedp.WaitVisible(chromedp.ID("quarantined")),
		chromedp.SendKeys(chromedp.CSS(`tr.row-claim input[name="operator"]`), "browser-test"),
		chromedp.SendKeys(chromedp.CSS(`tr.row-claim input[name="note"]`), "phase set to safe"),
		chromedp.Click(chromedp.CSS(`tr.row-claim button.release`)))
	waitLocation(t, ctx, "/quarantine?released=claim+"+d.quarantined)
	do("released", chromedp.WaitVisible(chromedp.ID("quarantined")))
	released := text("#quarantined")
	require.Contains(t, released, "Nothing is quarantined.")
	require.False(t, strings.Contains(released, d.quarantined), "the released row is gone")
	require.Equal(t, 1, d.b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = $1 AND released_by = 'browser-test'`, d.quarantined))
}

// waitLocation waits until the browser's page ends with suffix: a click
// on a form's button does not wait for the page it leads to.
func waitLocation(t *testing.T, ctx context.Context, suffix string) {
	t.Helper()
	var loc string
	require.Eventually(t, func() bool {
		var err error
		loc, err = chromedp.Run(ctx, chromedp.Location())
		return err == nil && strings.HasSuffix(loc, suffix)
	}, 30*time.Second, 50*time.Millisecond, "the browser should reach %s", suffix)
}
