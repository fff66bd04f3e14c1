package console_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/console"
	"github.com/promptline/promptline/internal/testkit"
)

// Every page of the console reads a time that is not a time ('-infinity',
// 'infinity': every timestamptz column admits them, and a hand edit, a
// restore or a repair script may leave one) and shows it in words where
// the time would be: the session (its report, decisions, releases and
// timeline), the timeline alone, the sessions list (paged across such a
// row), the recovery and quarantine pages. Before, each failed with a
// database error for the very session an operator had to look at.
func TestPagesShowTimesThatAreNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t, console.Config{PageSize: 1})
			b.admit(t, "s-odd", "m-odd", `/tool echo {"text":"hi"}`)
			b.run(t, "s-odd")
			b.quarantineClaim(t, "s-odd")
			_, err := b.pool.Exec(ctx, `INSERT INTO quarantine_releases (kind, ref, reason, released_by) VALUES ('claim', 's-odd', 'unknown phase', 'ops')`)
			require.NoError(t, err)
			testkit.SetTimesNotATime(t, b.pool, value)
			b.admit(t, "s-later", "m-later", "hello") // a session with times

			code, body := b.get(t, "/session?id=s-odd", "")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "created "+value+" · last admitted "+value)
			require.Contains(t, body, "<td>"+value+"</td>", "the claim's and the ledger's times")
			require.Contains(t, body, `id="timeline"`)
			require.Contains(t, body, "at "+value, "a tooltip says when")
			require.NotContains(t, body, "0001-01-01", "no zero time stands for the value")

			resp, err := http.Get(b.srv.URL + "/timeline.svg?id=s-odd")
			require.NoError(t, err)
			svg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(svg))
			require.Contains(t, string(svg), "<svg")
			require.Contains(t, string(svg), `class="attempt succeeded"`, "the ledger drawn")

			var seen []string
			next := "/sessions"
			for range 4 {
				code, body = b.get(t, next, "")
				require.Equal(t, http.StatusOK, code, body)
				for _, m := range regexp.MustCompile(`href="/session\?id=([^"]+)"`).FindAllStringSubmatch(body, -1) {
					seen = append(seen, m[1])
				}
				link := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
				if link == nil {
					break
				}
				next = strings.ReplaceAll(link[1], "&amp;", "&")
			}
			want := []string{"s-later", "s-odd"} // newest first
			if value == "infinity" {
				want = []string{"s-odd", "s-later"}
			}
			require.Equal(t, want, seen, "paged across the row, each session once")

			code, body = b.get(t, "/recovery", "")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "<td>"+value+"</td>")
			code, body = b.get(t, "/quarantine", "")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "<td>"+value+"</td>")
		})
	}
}
