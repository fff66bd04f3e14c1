package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/console"
	"github.com/promptline/promptline/internal/testkit"
)

// BenchmarkPages100k measures the console's pages over 100,000 sessions
// (docs/console.md gives the figures): the first page, a page deep in the
// list by its cursor, the state filters, a search by message ID and the
// recovery page. The rows are bulk-inserted (a turn each through the
// pipeline would take minutes): one promoted input per session, a few
// hundred live and quarantined claims, waiting inputs and recoveries.
func BenchmarkPages100k(b *testing.B) {
	pool, _ := testkit.Pool(b)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO sessions (session_id, fencing_token, created_at, last_admitted_at)
		 SELECT 's-' || g, 1, now() - g * interval '1 second', now() - g * interval '1 second' FROM generate_series(1, 100000) g`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, promotion_seq, wake_pending, admitted_at, promoted_at)
		 SELECT 'm-' || g, 's-' || g, 'hello ' || g, '\x00', 'queue', g, false, now() - g * interval '1 second', now() - g * interval '1 second'
		 FROM generate_series(1, 100000) g`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		 SELECT 'w-' || g, 's-' || g, 'waiting', '\x00', 'queue', true FROM generate_series(1, 100000, 500) g`,
		`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		 SELECT 's-' || g, 'e-' || g, 'o', 1, 'ready', now() + interval '1 hour' FROM generate_series(3, 100000, 400) g`,
		`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason, quarantined_at)
		 SELECT 's-' || g, 'e-' || g, 'o', 1, 'bogus', now(), 'unknown phase', now() FROM generate_series(7, 100000, 1000) g`,
		`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by, decided_at)
		 SELECT 'r-' || g, 's-' || g, 'unknown', 'reconciled', '{}', 1, 2, 'bench', now() - g * interval '1 second' FROM generate_series(1, 100000, 10) g`,
		`ANALYZE`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(b, err, sql)
	}
	s, err := console.New(pool, &console.Config{Logger: slogTo(new(strings.Builder))})
	require.NoError(b, err)
	srv := httptest.NewServer(s)
	b.Cleanup(srv.Close)

	get := func(b *testing.B, path string) string {
		resp, err := http.Get(srv.URL + path)
		require.NoError(b, err)
		defer resp.Body.Close()
		body := new(strings.Builder)
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			body.Write(buf[:n])
			if err != nil {
				break
			}
		}
		require.Equal(b, http.StatusOK, resp.StatusCode, path)
		return body.String()
	}
	// A cursor 40,000 sessions deep.
	var at string
	require.NoError(b, pool.QueryRow(ctx, `SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') FROM sessions WHERE session_id = 's-40000'`).Scan(&at))
	deep := "/sessions?after=" + strings.NewReplacer(":", "%3A", "|", "%7C").Replace(at+"|s-40000")
	for _, c := range []struct{ name, path string }{
		{"SessionsFirstPage", "/sessions"},
		{"SessionsDeepPage", deep},
		{"StateIdle", "/sessions?state=idle"},
		{"StateWaiting", "/sessions?state=waiting"},
		{"StateRunning", "/sessions?state=running"},
		{"StateQuarantined", "/sessions?state=quarantined"},
		{"SearchMessageID", "/sessions?q=m-77777"},
		{"Recovery", "/recovery"},
		{"Quarantine", "/quarantine"},
	} {
		body := get(b, c.path)
		if c.name != "Quarantine" && c.name != "Recovery" {
			require.Regexp(b, regexp.MustCompile(`href="/session\?id=s-`), body, c.name)
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				get(b, c.path)
			}
		})
	}
}
