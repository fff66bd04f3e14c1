package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/pgdb"
)

// Row is one message to publish: written in the transaction of the state
// change it announces, published by the Relay at least once.
type Row struct {
	Topic   string
	Key     string
	Payload []byte
}

// Insert writes rows inside tx, in order: the relay publishes the rows of
// one transaction and key in the order of their IDs (across transactions,
// see Relay).
func Insert(ctx context.Context, tx pgx.Tx, rows ...Row) error {
	if len(rows) == 0 {
		return nil
	}
	topics, keys, payloads := Columns(rows)
	if _, err := tx.Exec(ctx, insertSQL, topics, keys, payloads); err != nil {
		return fmt.Errorf("writing %d outbox rows: %w", len(rows), err)
	}
	return nil
}

// Columns are rows as insertSQL's three arrays, in order: the arguments
// by which a SQL function that writes a whole transaction in one call
// (migration 00018) inserts them as insertSQL does.
func Columns(rows []Row) (topics, keys []string, payloads [][]byte) {
	topics = make([]string, len(rows))
	keys = make([]string, len(rows))
	payloads = make([][]byte, len(rows))
	for i, r := range rows {
		topics[i], keys[i], payloads[i] = r.Topic, r.Key, r.Payload
	}
	return topics, keys, payloads
}

// WITH ORDINALITY keeps the caller's order in the identity column.
const insertSQL = `
INSERT INTO outbox (topic, key, payload)
SELECT t, k, p FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS r(t, k, p, n)
ORDER BY n`

// EventRow is the outbox row announcing a session event on topic, cut to
// fit the relay's default limit (EventRowWithin).
func EventRow(topic string, e envelope.Event) Row {
	return EventRowWithin(topic, e, 0)
}

// EventRowWithin is the outbox row announcing a session event on topic,
// its outside content cut (envelope.Event.MarshalWithin) so that the
// relay's message fits in maxMessageBytes (RelayConfig.MaxMessageBytes;
// 0 for its default): a row larger than the relay sends is quarantined,
// and an event is never released from that, however often an operator
// tries.
func EventRowWithin(topic string, e envelope.Event, maxMessageBytes int) Row {
	limit := cmp.Or(maxMessageBytes, maxMessageBytesDefault)
	b := e.MarshalWithin(limit - messageBytes(e.SessionID, 0))
	return Row{Topic: topic, Key: e.SessionID, Payload: b}
}

// messageBytes is about the size of the message the relay sends for a row
// of key and payload, as Sarama counts it against its limit: the key, the
// payload, the outbox ID's header and a record's own fields.
func messageBytes(key string, payload int) int {
	return payload + len(key) + len(HeaderOutboxID) + 64
}

// WakeRow is the outbox row waking session on topic.
func WakeRow(topic, session, reason string, at time.Time) Row {
	b, _ := json.Marshal(envelope.Wake{SessionID: session, Reason: reason, At: at})
	return Row{Topic: topic, Key: session, Payload: b}
}

// ReleaseParams names the quarantined row an operator releases: its ID as
// text, as an operator types it (an ID that is no number finds no row).
type ReleaseParams struct {
	ID string
	// QuarantinedAt, when not nil, releases the row only if its
	// quarantine began then: a caller that listed the row first (a bulk
	// release) leaves alone a row released and quarantined again since.
	// Defaults to any quarantine.
	QuarantinedAt *pgdb.Time
}

// Release lifts the quarantine of an outbox row, which the next relay pass
// then publishes (repair its payload first, or it is quarantined again),
// and returns the reason it was quarantined for; found is false, and
// nothing is written, when no quarantined row has that ID. The caller
// audits the release (recovery.Release).
func Release(ctx context.Context, tx pgx.Tx, p *ReleaseParams) (reason string, found bool, err error) {
	id, err := strconv.ParseInt(p.ID, 10, 64)
	if err != nil || strconv.FormatInt(id, 10) != p.ID {
		return "", false, nil // no row has that ID as its text
	}
	rows, err := tx.Query(ctx, releaseSQL, id, p.QuarantinedAt)
	if err != nil {
		return "", false, fmt.Errorf("releasing outbox row %s: %w", p.ID, err)
	}
	// Collected, not scanned: no row is an answer here, not an error.
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", false, fmt.Errorf("releasing outbox row %s: %w", p.ID, err)
	}
	if len(reasons) == 0 {
		return "", false, nil
	}
	return reasons[0], true, nil
}

// CountQuarantined counts the quarantined rows (the outbox kind of the
// gauge promptline_quarantined_rows); q is the pool or a transaction. The
// error is the driver's, for the caller to say what it was doing.
func CountQuarantined(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var n int
	if err := q.QueryRow(ctx, countQuarantinedSQL).Scan(&n); err != nil {
		return 0, err
	}
	return n, nil
}

const countQuarantinedSQL = `SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL`

// releaseSQL returns the reason from before the update (RETURNING alone
// gives the new row's).
const releaseSQL = `
WITH old AS (
    SELECT id, quarantine_reason FROM outbox
    WHERE id = $1 AND quarantine_reason IS NOT NULL
      AND ($2::timestamptz IS NULL OR quarantined_at = $2) FOR UPDATE
)
UPDATE outbox o SET quarantine_reason = NULL, quarantined_at = NULL
FROM old WHERE o.id = old.id
RETURNING old.quarantine_reason`
