package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
)

// Row is one message to publish: written in the transaction of the state
// change it announces, published by the Relay at least once.
type Row struct {
	Topic   string
	Key     string
	Payload []byte
}

// Insert writes rows inside tx, in order: the relay publishes rows of one
// key in the order of their IDs.
func Insert(ctx context.Context, tx pgx.Tx, rows ...Row) error {
	if len(rows) == 0 {
		return nil
	}
	topics, keys, payloads := columns(rows)
	if _, err := tx.Exec(ctx, insertSQL, topics, keys, payloads); err != nil {
		return fmt.Errorf("writing %d outbox rows: %w", len(rows), err)
	}
	return nil
}

// QueueInsert is Insert for a queued write (a pgx.Batch sent as one
// transaction).
func QueueInsert(b *pgx.Batch, rows ...Row) {
	if len(rows) == 0 {
		return
	}
	topics, keys, payloads := columns(rows)
	b.Queue(insertSQL, topics, keys, payloads)
}

// columns are insertSQL's arrays.
func columns(rows []Row) (topics, keys []string, payloads [][]byte) {
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

// EventRow is the outbox row announcing a session event on topic.
func EventRow(topic string, e envelope.Event) Row {
	b, _ := json.Marshal(e) // an Event always marshals
	return Row{Topic: topic, Key: e.SessionID, Payload: b}
}

// WakeRow is the outbox row waking session on topic.
func WakeRow(topic, session, reason string, at time.Time) Row {
	b, _ := json.Marshal(envelope.Wake{SessionID: session, Reason: reason, At: at})
	return Row{Topic: topic, Key: session, Payload: b}
}
