package admission

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Stored is what inputs holds under a prompt's message ID: what a second
// admission of that ID is classified against.
type Stored struct {
	Hash []byte
	// Armed: the input's wake is pending (wake_pending).
	Armed bool
	// Promoted: the input has been promoted into a turn.
	Promoted bool
	Kind     string
}

// Classify is admission's rule for a prompt whose message ID is stored
// already (docs/design.md, invariants 2 and 3), for live admission and for
// replay alike: a conflict, which changes nothing, unless the stored input
// is a prompt with the same payload hash; otherwise a duplicate, and arm
// says whether the retry arms the stored input's wake: it asks to be
// resumed (envelope.Prompt.Resumes) and the input has neither a wake
// pending nor been promoted.
func Classify(s Stored, hash []byte, resumes bool) (o Outcome, arm bool) {
	if s.Kind != KindPrompt || !bytes.Equal(s.Hash, hash) {
		return Conflict, false
	}
	return Duplicate, resumes && !s.Armed && !s.Promoted
}

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadStored reads what inputs holds under ids, without locking or
// writing (replay classifies prompts admitted before with it); an ID
// nothing holds is absent from the map.
func ReadStored(ctx context.Context, q Querier, ids []string) (map[string]Stored, error) {
	return readStored(ctx, q, readStoredSQL, ids)
}

func readStored(ctx context.Context, q Querier, sql string, ids []string) (map[string]Stored, error) {
	rows, err := q.Query(ctx, sql, ids)
	if err != nil {
		return nil, fmt.Errorf("reading admitted inputs: %w", err)
	}
	out := make(map[string]Stored, len(ids))
	var id string
	var s Stored
	if _, err := pgx.ForEachRow(rows, []any{&id, &s.Hash, &s.Armed, &s.Promoted, &s.Kind}, func() error {
		out[id] = Stored{Hash: slices.Clone(s.Hash), Armed: s.Armed, Promoted: s.Promoted, Kind: s.Kind}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading admitted inputs: %w", err)
	}
	return out, nil
}

const readStoredSQL = `
SELECT message_id, payload_hash, wake_pending, promotion_seq IS NOT NULL, kind
FROM inputs WHERE message_id = ANY($1)`

// FOR UPDATE: a concurrent batch arming the same input waits for us.
const selectExistingSQL = readStoredSQL + ` ORDER BY message_id FOR UPDATE`
