package admission

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/outbox"
)

// Outcome classifies one prompt at admission.
type Outcome int

const (
	// Admitted: a new input row.
	Admitted Outcome = iota + 1
	// Duplicate: an exact retry of an admitted prompt (same ID, same
	// payload hash); nothing new, though it may arm a wake.
	Duplicate
	// Conflict: the message ID is taken by another payload; nothing changed.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return "unknown"
}

// Source is where a prompt came from.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Incoming is one decoded prompt to admit.
type Incoming struct {
	Prompt envelope.Prompt
	Source Source
}

// AdmitterConfig configures an Admitter.
type AdmitterConfig struct {
	// Topics names the outbox targets. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// OnAdmittedFunc runs after each committed admission transaction with
	// the outcome of each of its prompts, in order, and how long it took
	// (retries of a raced transaction included). Defaults to nothing.
	OnAdmittedFunc func(outcomes []Outcome, took time.Duration)
	// OnCommit runs after each commit that wrote outbox rows (the relay's
	// Nudge). Defaults to nothing.
	OnCommitFunc func()
}

// Admitter admits prompts into Postgres exactly once: inputs, their session
// rows and their outbox rows (input.admitted, wakes) in one transaction per
// batch (docs/design.md, invariant 1).
type Admitter struct {
	pool *pgxpool.Pool
	cfg  AdmitterConfig
}

// NewAdmitter returns an Admitter.
func NewAdmitter(pool *pgxpool.Pool, config *AdmitterConfig) *Admitter {
	cfg := *config
	cfg.Topics = cfg.Topics.WithDefaults()
	return &Admitter{pool: pool, cfg: cfg}
}

// The kinds of input (inputs.kind). Internal inputs are told apart from
// prompts by their kind, never by their message ID, which a sender
// chooses (docs/design.md, invariant 14): a prompt is a prompt whatever its ID.
const (
	KindPrompt          = "prompt"
	KindPermissionReply = "permission_reply"
	KindContinuation    = "continuation"
)

// Admit admits a batch in one transaction and returns each prompt's
// outcome, in order. Every copy of a message ID is classified as if each
// had come in a batch of its own: against the stored row when there is
// one, else against the batch's first copy, which becomes the row.
func (a *Admitter) Admit(ctx context.Context, batch []Incoming) ([]Outcome, error) {
	return a.admit(ctx, batch, nil)
}

// errAdmissionRaced: another transaction admitted one of the batch's IDs
// between the statement that locked the sessions and the insert, so the
// sessions locked are not the ones the outcome needs; the transaction is
// rolled back and run again.
var errAdmissionRaced = errors.New("a message ID was admitted concurrently")

// maxAdmitRaces bounds the runs of one batch that lose errAdmissionRaced;
// after them the error goes to the caller, which retries the batch.
const maxAdmitRaces = 3

// admit is Admit; afterCommit, when not nil, runs right after the commit,
// before the relay is nudged, with the wake rows the batch committed (none,
// maybe).
func (a *Admitter) admit(ctx context.Context, batch []Incoming, afterCommit func(wakes []outbox.Row)) ([]Outcome, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	start := time.Now()
	outcomes := make([]Outcome, len(batch))

	// The first copy of each message ID is the candidate row; wantWake is
	// the wake it is inserted with: asked by it or by a later exact copy.
	hashes := make([][]byte, len(batch)) // each prompt's, computed once
	for i, in := range batch {
		hashes[i] = in.Prompt.Hash()
	}
	firstOf := make([]int, len(batch))
	first := make(map[string]int, len(batch))
	var cand []int
	wantWake := make([]bool, len(batch))
	// A message ID of a tool call's form is a conflict, and takes no part
	// in the rest (envelope.IsToolCallID): the call's result is written
	// under that ID once its tool returns, so the prompt's user message
	// would collide with it, and every claim of the session would fail.
	// The lookup of messages below sees only results already written.
	reserved := make([]bool, len(batch))
	for i, in := range batch {
		if envelope.IsToolCallID(in.Prompt.MessageID) {
			reserved[i], outcomes[i] = true, Conflict
			continue
		}
		j, ok := first[in.Prompt.MessageID]
		if !ok {
			j = i
			first[in.Prompt.MessageID] = i
			cand = append(cand, i)
		}
		firstOf[i] = j
		if bytes.Equal(hashes[j], hashes[i]) {
			wantWake[j] = wantWake[j] || in.Prompt.Resumes()
		}
	}

	// The first statement reads which IDs are stored and upserts (and so
	// locks) the sessions the outcome may write to, in byte order:
	// admission and release serialise on the session row (invariant 7),
	// and sorted locking keeps concurrent batches free of deadlocks. Those
	// are the session of a new ID's first copy and the session of a stored
	// row that a copy retries exactly (it may arm the wake); a conflicting
	// copy's session is neither created nor touched (invariant 2).
	lock := lockSessionsParams{}
	for i, in := range batch {
		if reserved[i] {
			continue
		}
		lock.ids = append(lock.ids, in.Prompt.MessageID)
		lock.sessions = append(lock.sessions, in.Prompt.SessionID)
		lock.hashes = append(lock.hashes, hashes[i])
		lock.first = append(lock.first, firstOf[i] == i)
	}
	p := insertInputsParams{}
	for _, i := range cand {
		in := batch[i]
		p.ids = append(p.ids, in.Prompt.MessageID)
		p.sessions = append(p.sessions, in.Prompt.SessionID)
		p.texts = append(p.texts, in.Prompt.Text)
		p.hashes = append(p.hashes, hashes[i])
		p.deliveries = append(p.deliveries, string(cmp.Or(in.Prompt.Delivery, envelope.DeliveryQueue)))
		p.wakes = append(p.wakes, wantWake[i])
		p.topics = append(p.topics, in.Source.Topic)
		p.partitions = append(p.partitions, in.Source.Partition)
		p.offsets = append(p.offsets, in.Source.Offset)
	}
	// The settings and both statements go with BEGIN, in one round trip.
	var stored, inserted, takenIDs []string
	begin := &pgx.Batch{}
	begin.Queue(admissionSettingsSQL)
	begin.Queue(lockSessionsSQL, lock.ids, lock.sessions, lock.hashes, lock.first).
		Query(func(r pgx.Rows) error {
			stored, takenIDs = stored[:0], takenIDs[:0]
			var id string
			var isTaken bool
			_, err := pgx.ForEachRow(r, []any{&id, &isTaken}, func() error {
				if isTaken {
					takenIDs = append(takenIDs, id)
				} else {
					stored = append(stored, id)
				}
				return nil
			})
			return err
		})
	begin.Queue(insertInputsSQL, p.ids, p.sessions, p.texts, p.hashes, p.deliveries, p.wakes, p.topics, p.partitions, p.offsets).
		Query(func(r pgx.Rows) (err error) {
			inserted, err = pgx.CollectRows(r, pgx.RowTo[string])
			return err
		})

	var rows, wakes []outbox.Row
	var err error
	for range maxAdmitRaces {
		err = pgdb.InTxFrom(ctx, a.pool, begin, func(tx pgx.Tx) error {
			rows, wakes = rows[:0], wakes[:0]
			isNew := make(map[string]bool, len(inserted))
			for _, id := range inserted {
				isNew[id] = true
			}
			wasStored := make(map[string]bool, len(stored))
			for _, id := range stored {
				wasStored[id] = true
			}
			// An ID that names a message promptline wrote (an answer, a
			// tool's result) and no input: its user message would collide
			// with that message when the prompt's turn is claimed, and
			// every claim of the session would fail. A conflict.
			taken := make(map[string]bool, len(takenIDs))
			for _, id := range takenIDs {
				taken[id] = true
			}

			// The rest were admitted before: exact retries or conflicts.
			var old []string
			for _, i := range cand {
				id := batch[i].Prompt.MessageID
				if taken[id] && !isNew[id] {
					continue
				}
				if isNew[id] == wasStored[id] {
					return errAdmissionRaced
				}
				if !isNew[id] {
					old = append(old, id)
				}
			}
			prior := map[string]Stored{}
			if len(old) > 0 {
				var err error
				if prior, err = readStored(ctx, tx, selectExistingSQL, old); err != nil {
					return err
				}
			}

			wakeSessions := map[string]bool{}
			var arm []string
			armed := map[string]bool{}
			now := time.Now().UTC()
			for i, in := range batch {
				if reserved[i] {
					continue
				}
				id, j := in.Prompt.MessageID, firstOf[i]
				if taken[id] && !isNew[id] {
					outcomes[i] = Conflict
					continue
				}
				if isNew[id] {
					switch {
					case i == j:
						outcomes[i] = Admitted
						rows = append(rows, eventRow(a.cfg.Topics.Events, envelope.Event{
							ID: "input.admitted:" + id, Type: envelope.EventInputAdmitted,
							SessionID: in.Prompt.SessionID, At: now, MessageID: id,
						}))
						if wantWake[i] {
							wakeSessions[in.Prompt.SessionID] = true
						}
					case bytes.Equal(hashes[j], hashes[i]):
						outcomes[i] = Duplicate // its resume is in wantWake[j]
					default:
						outcomes[i] = Conflict
					}
					continue
				}
				// invariants 2 and 3: a conflict changes nothing; an exact
				// retry may arm the wake.
				var arms bool
				outcomes[i], arms = Classify(prior[id], hashes[i], in.Prompt.Resumes())
				if arms && !armed[id] {
					armed[id] = true
					arm = append(arm, id)
					wakeSessions[in.Prompt.SessionID] = true
				}
			}
			if len(arm) > 0 {
				if _, err := tx.Exec(ctx, armSQL, arm); err != nil {
					return fmt.Errorf("arming wakes: %w", err)
				}
			}
			ws := make([]string, 0, len(wakeSessions))
			for s := range wakeSessions {
				ws = append(ws, s)
			}
			slices.Sort(ws)
			for _, s := range ws {
				wakes = append(wakes, wakeRow(a.cfg.Topics.Wakes, s, "admitted", now))
			}
			return outbox.Insert(ctx, tx, append(rows, wakes...)...)
		})
		if !errors.Is(err, errAdmissionRaced) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("admitting %d prompts: %w", len(batch), err)
	}
	if afterCommit != nil {
		afterCommit(wakes)
	}
	if len(rows)+len(wakes) > 0 && a.cfg.OnCommitFunc != nil {
		a.cfg.OnCommitFunc()
	}
	if f := a.cfg.OnAdmittedFunc; f != nil {
		f(outcomes, time.Since(start))
	}
	return outcomes, nil
}

type lockSessionsParams struct {
	ids, sessions []string
	hashes        [][]byte
	first         []bool
}

type insertInputsParams struct {
	ids, sessions, texts, deliveries, topics []string
	hashes                                   [][]byte
	wakes                                    []bool
	partitions                               []int32
	offsets                                  []int64
}

var (
	eventRow = outbox.EventRow
	wakeRow  = outbox.WakeRow
)

// admissionSettingsSQL opens every admission transaction: sequential
// scans off for the transaction (set_config's true: SET LOCAL). Every
// statement admission runs is a lookup by key (lockSessionsSQL,
// selectExistingSQL, armSQL) or an insert; all are prepared, and Postgres
// keeps the generic plan it makes after five executions, at the table's
// size and statistics of that moment, until an analyze invalidates it. A
// plan made while inputs was small (before the first analyze, or after an
// analyze of a few dozen rows) scanned the whole table, and was kept as the
// table grew: 3,090 scans read 19.8 million tuples for 15,000 turns in the
// bench's steady phase (docs/benchmarks.md, "A plan made on a small
// table"). With sequential scans off, a lookup by key is the plan at every
// size; the relay's pass does the same (outbox's passSettings).
const admissionSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true)`

// lockSessionsSQL returns the IDs stored at its snapshot, and upserts the
// sessions of the copies that may write: a new ID's first copy, and a
// copy equal to the stored prompt (same hash: same session). A row admitted
// after the snapshot shows as an ID neither stored nor inserted
// (errAdmissionRaced).
//
// stored reads inputs by "message_id = ANY($1)", an index condition
// whatever the planner knows; "IN (SELECT id FROM c)" is a join, and with
// sequential scans off its generic plan, made after an analyze of a few
// hundred rows of time-ordered IDs, was a hash join over a full scan of
// inputs_pkey, kept as the table grew
// (TestAdmissionPlansAreIndexLookupsAtAnySize).
//
// The sessions are upserted, and so locked, in byte order (COLLATE "C"),
// not in the database's collation: byte order is the order of Go's string
// comparison, in which the ledger's group commit sorts the sessions of a
// combined transaction; under another collation (en-US puts 'a' before
// 'B') the two could each hold a session the other waits for
// (TestAdmissionLocksSessionsInByteOrder).
const lockSessionsSQL = `
WITH c AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bool[]) AS c(id, s, h, first)
), stored AS (
    SELECT message_id, payload_hash, kind FROM inputs WHERE message_id = ANY($1::text[])
), taken AS (
    SELECT m.message_id FROM messages m WHERE m.message_id = ANY($1::text[])
    AND NOT EXISTS (SELECT FROM stored WHERE stored.message_id = m.message_id)
), upserted AS (
    INSERT INTO sessions (session_id)
    SELECT DISTINCT c.s COLLATE "C" FROM c LEFT JOIN stored ON stored.message_id = c.id
    WHERE CASE WHEN stored.message_id IS NULL THEN c.first ELSE stored.kind = 'prompt' AND stored.payload_hash = c.h END
    AND NOT EXISTS (SELECT FROM taken WHERE taken.message_id = c.id)
    ORDER BY 1
    ON CONFLICT (session_id) DO UPDATE SET last_admitted_at = now()
)
SELECT message_id, false FROM stored
UNION ALL
SELECT message_id, true FROM taken`

// WITH ORDINALITY keeps the batch order in admission_seq.
const insertInputsSQL = `
INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending,
                    source_topic, source_partition, source_offset, kind)
SELECT id, s, t, h, d, w, st, sp, so, 'prompt'
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::bool[],
            $7::text[], $8::int[], $9::bigint[]) WITH ORDINALITY AS r(id, s, t, h, d, w, st, sp, so, n)
WHERE NOT EXISTS (SELECT FROM messages m WHERE m.message_id = r.id)
ORDER BY n
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id`

const armSQL = `UPDATE inputs SET wake_pending = true WHERE message_id = ANY($1)`
