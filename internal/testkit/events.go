package testkit

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
)

// SessionEvents reads the session events written for session, published
// or not, in the order they were written, decoded as a consumer decodes
// them; only those of the given types, or all when none is given. It
// reads the outbox, not the topic: event IDs are deterministic, so a
// consumer deduplicating on them would hide a second write of the same
// event, which the outbox keeps.
func SessionEvents(tb testing.TB, pool *pgxpool.Pool, session string, types ...string) []envelope.Event {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `SELECT payload FROM outbox WHERE topic = 'session-events' AND key = $1 ORDER BY id`, session)
	if err != nil {
		tb.Fatalf("reading the session events of %q: %v", session, err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		tb.Fatalf("reading the session events of %q: %v", session, err)
	}
	var out []envelope.Event
	for _, p := range payloads {
		e, err := envelope.DecodeEvent(p)
		if err != nil {
			tb.Fatalf("a session event of %q does not decode: %v\n%s", session, err, p)
		}
		if len(types) == 0 || slices.Contains(types, e.Type) {
			out = append(out, e)
		}
	}
	return out
}

// CountEvents counts the session events of type typ written for session
// (see SessionEvents).
func CountEvents(tb testing.TB, pool *pgxpool.Pool, session, typ string) int {
	tb.Helper()
	return len(SessionEvents(tb, pool, session, typ))
}
