package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/metrics"
	"github.com/promptline/promptline/outbox"
)

// ExecutorConfig configures an Executor.
type ExecutorConfig struct {
	// Topics names the outbox targets. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// Provider answers turns. Defaults to ScriptedProvider.
	Provider Provider
	// MaxSessions bounds the sessions executing at once; Wake blocks (and
	// so consumption pauses) while all are busy. Defaults to 256.
	MaxSessions int
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics defaults to none.
	Metrics *metrics.Metrics
	// OnCommitFunc runs after each commit that wrote outbox rows (the
	// relay's Nudge). Defaults to nothing.
	OnCommitFunc func()
}

const maxSessionsDefault = 256

// Executor runs sessions: for a woken session it promotes the waiting
// inputs turn by turn, calls the provider, stores the answer and announces
// it, until nothing waits. One session never runs twice in one process:
// wakes for a running session fold into one successor run.
type Executor struct {
	pool  *pgxpool.Pool
	cfg   ExecutorConfig
	log   *slog.Logger
	slots chan struct{}

	mu      sync.Mutex
	runs    map[string]*sessionRun
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
}

type sessionRun struct {
	again bool          // a wake arrived while running: run once more
	done  chan struct{} // closed when the session goes idle
}

// NewExecutor returns an Executor; Stop ends it.
func NewExecutor(pool *pgxpool.Pool, config *ExecutorConfig) *Executor {
	cfg := *config
	cfg.Topics = cfg.Topics.WithDefaults()
	cfg.Provider = cmp.Or[Provider](cfg.Provider, ScriptedProvider{})
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, maxSessionsDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Executor{
		pool: pool, cfg: cfg, log: cfg.Logger,
		slots: make(chan struct{}, cfg.MaxSessions),
		runs:  map[string]*sessionRun{}, ctx: ctx, cancel: cancel,
	}
}

// ErrStopped is returned by Wake after Stop.
var ErrStopped = errors.New("executor stopped")

// Wake asks for the session to run. It returns a channel closed when the
// session has gone idle after handling everything that waited when the
// wake arrived. It blocks while MaxSessions sessions run, until ctx ends.
func (e *Executor) Wake(ctx context.Context, sessionID string) (<-chan struct{}, error) {
	if done, ok := e.coalesce(sessionID); ok {
		return done, nil
	}
	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.ctx.Done():
		return nil, ErrStopped
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		<-e.slots
		return nil, ErrStopped
	}
	if r, ok := e.runs[sessionID]; ok { // started while we waited for a slot
		<-e.slots
		r.again = true
		e.wakeMetric("coalesced")
		return r.done, nil
	}
	r := &sessionRun{done: make(chan struct{})}
	e.runs[sessionID] = r
	e.wg.Add(1)
	go e.run(sessionID, r)
	e.wakeMetric("started")
	return r.done, nil
}

func (e *Executor) coalesce(sessionID string) (<-chan struct{}, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.runs[sessionID]; ok {
		r.again = true
		e.wakeMetric("coalesced")
		return r.done, true
	}
	return nil, false
}

func (e *Executor) wakeMetric(result string) {
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.Wakes.WithLabelValues(result).Inc()
	}
}

// Stop cancels running turns and waits for them to settle. It may be
// called twice.
func (e *Executor) Stop() {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
}

func (e *Executor) run(sessionID string, r *sessionRun) {
	defer e.wg.Done()
	defer func() { <-e.slots }()
	if m := e.cfg.Metrics; m != nil {
		m.ActiveExecutions.Inc()
		defer m.ActiveExecutions.Dec()
	}
	log := e.log.With(slog.String("session_id", sessionID))
	for {
		if err := e.drain(e.ctx, sessionID, log); err != nil && e.ctx.Err() == nil {
			log.ErrorContext(e.ctx, "session execution failed", slog.Any("error", err))
		}
		e.mu.Lock()
		if r.again && e.ctx.Err() == nil {
			r.again = false
			e.mu.Unlock()
			continue
		}
		delete(e.runs, sessionID)
		close(r.done)
		e.mu.Unlock()
		return
	}
}

// drain runs turns until no input waits.
func (e *Executor) drain(ctx context.Context, sessionID string, log *slog.Logger) error {
	x := &execution{e: e, sessionID: sessionID}
	for ctx.Err() == nil {
		t, err := x.promote(ctx)
		if err != nil {
			return err
		}
		if t == nil {
			return nil
		}
		faults.Hit(faults.TurnAfterPromote)
		if err := x.runTurn(ctx, t, log); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// turn is one promoted batch of inputs and the assistant message answering it.
type turn struct {
	inputs      []TranscriptMessage
	assistantID string
	history     []TranscriptMessage
	promotedAt  time.Time
}

// execution is the one path through which an execution writes. Every write
// transaction opens with the fence statement (see write); issue by issue the
// fence grows (today: the session row lock; next: the claim's fencing token
// and live lease), and no executor write can bypass it.
type execution struct {
	e         *Executor
	sessionID string
}

// ErrFenced says that an execution lost its right to write.
var ErrFenced = errors.New("execution fenced: claim lost")

// write runs fn in a transaction that first passes the fence. Outbox rows
// written by fn are announced to the relay after commit.
func (x *execution) write(ctx context.Context, fn func(tx pgx.Tx) error) error {
	err := pgx.BeginFunc(ctx, x.e.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, fenceSQL, x.sessionID)
		if err != nil {
			return fmt.Errorf("fence: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrFenced
		}
		return fn(tx)
	})
	if err == nil && x.e.cfg.OnCommitFunc != nil {
		x.e.cfg.OnCommitFunc()
	}
	return err
}

// promote takes the next turn's inputs: every waiting steer if any (they
// jump the queue), else the oldest queued input. It creates their user
// messages and the pending assistant message in the same transaction.
func (x *execution) promote(ctx context.Context) (*turn, error) {
	var t *turn
	err := x.write(ctx, func(tx pgx.Tx) error {
		t = nil
		rows, err := tx.Query(ctx, waitingSQL, x.sessionID)
		if err != nil {
			return fmt.Errorf("reading waiting inputs: %w", err)
		}
		type waiting struct{ id, text, delivery string }
		var all []waiting
		var w waiting
		if _, err := pgx.ForEachRow(rows, []any{&w.id, &w.text, &w.delivery}, func() error {
			all = append(all, w)
			return nil
		}); err != nil {
			return fmt.Errorf("reading waiting inputs: %w", err)
		}
		if len(all) == 0 {
			return nil
		}
		var pick []waiting
		for _, w := range all {
			if w.delivery == string(envelope.DeliverySteer) {
				pick = append(pick, w)
			}
		}
		if len(pick) == 0 {
			pick = all[:1]
		}
		t = &turn{assistantID: newID(), promotedAt: time.Now()}
		ids := make([]string, len(pick))
		for i, w := range pick {
			ids[i] = w.id
			t.inputs = append(t.inputs, TranscriptMessage{ID: w.id, Role: "user", Text: w.text})
			if _, err := tx.Exec(ctx, promoteSQL, w.id); err != nil {
				return fmt.Errorf("promoting %s: %w", w.id, err)
			}
		}
		if _, err := tx.Exec(ctx, insertAssistantSQL, t.assistantID, x.sessionID, ids); err != nil {
			return fmt.Errorf("creating assistant message: %w", err)
		}
		hist, err := tx.Query(ctx, historySQL, x.sessionID)
		if err != nil {
			return fmt.Errorf("reading transcript: %w", err)
		}
		var m TranscriptMessage
		_, err = pgx.ForEachRow(hist, []any{&m.ID, &m.Role, &m.Text}, func() error {
			t.history = append(t.history, m)
			return nil
		})
		return err
	})
	return t, err
}

func (x *execution) runTurn(ctx context.Context, t *turn, log *slog.Logger) error {
	ids := make([]string, len(t.inputs))
	for i, in := range t.inputs {
		ids[i] = in.ID
	}
	log = log.With(slog.String("assistant_message_id", t.assistantID))
	resp, perr := x.e.cfg.Provider.Complete(ctx, ProviderRequest{
		SessionID: x.sessionID, AssistantMessageID: t.assistantID, Messages: t.history, Turn: t.inputs,
	})
	// A turn cut off by shutdown is settled as failed, on a context that
	// outlives the cancellation: the provider may have acted, so it is never
	// retried automatically.
	wctx := ctx
	reason := envelope.FailProviderError
	switch {
	case perr != nil && ctx.Err() != nil:
		wctx, reason = context.WithoutCancel(ctx), envelope.FailInterrupted
	case errors.Is(perr, ErrUnsupported):
		reason = envelope.FailUnsupported
	}
	now := time.Now().UTC()
	ev := envelope.Event{SessionID: x.sessionID, At: now, MessageIDs: ids, AssistantMessageID: t.assistantID}
	err := x.write(wctx, func(tx pgx.Tx) error {
		if perr != nil {
			ev.ID, ev.Type, ev.Reason, ev.Error = "turn.failed:"+t.assistantID, envelope.EventTurnFailed, reason, perr.Error()
			if _, err := tx.Exec(wctx, failAssistantSQL, t.assistantID, perr.Error()); err != nil {
				return fmt.Errorf("storing failed turn: %w", err)
			}
		} else {
			ev.ID, ev.Type, ev.Text = "turn.completed:"+t.assistantID, envelope.EventTurnCompleted, resp.Text
			if _, err := tx.Exec(wctx, completeAssistantSQL, t.assistantID, resp.Text); err != nil {
				return fmt.Errorf("storing answer: %w", err)
			}
		}
		return outbox.Insert(wctx, tx, eventRow(x.e.cfg.Topics.Events, ev))
	})
	if err != nil {
		return fmt.Errorf("settling turn %s: %w", t.assistantID, err)
	}
	outcome := "completed"
	if perr != nil {
		outcome = "failed"
		log.WarnContext(ctx, "turn failed", slog.String("reason", reason), slog.Any("error", perr))
	}
	if m := x.e.cfg.Metrics; m != nil {
		m.Turns.WithLabelValues(outcome).Inc()
		m.TurnSeconds.Observe(time.Since(t.promotedAt).Seconds())
	}
	return nil
}

// fenceSQL is the statement every execution write transaction opens with.
const fenceSQL = `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`

const waitingSQL = `
SELECT message_id, text, delivery FROM inputs
WHERE session_id = $1 AND promotion_seq IS NULL
ORDER BY admission_seq`

const promoteSQL = `
WITH p AS (
    UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now()
    WHERE message_id = $1 AND promotion_seq IS NULL
    RETURNING message_id, session_id, text
), m AS (
    INSERT INTO messages (message_id, session_id, role, status, completed_at)
    SELECT message_id, session_id, 'user', 'completed', now() FROM p
)
INSERT INTO message_parts (message_id, idx, kind, body) SELECT message_id, 0, 'text', text FROM p`

const insertAssistantSQL = `
INSERT INTO messages (message_id, session_id, role, status, answers) VALUES ($1, $2, 'assistant', 'pending', $3)`

// The provider sees user messages and completed assistant answers.
const historySQL = `
SELECT m.message_id, m.role, coalesce(string_agg(p.body, '' ORDER BY p.idx), '')
FROM messages m LEFT JOIN message_parts p ON p.message_id = m.message_id
WHERE m.session_id = $1 AND (m.role = 'user' OR m.status = 'completed')
GROUP BY m.message_id, m.role, m.seq
ORDER BY m.seq`

const completeAssistantSQL = `
WITH m AS (
    UPDATE messages SET status = 'completed', completed_at = now()
    WHERE message_id = $1 AND status = 'pending' RETURNING message_id
)
INSERT INTO message_parts (message_id, idx, kind, body) SELECT message_id, 0, 'text', $2 FROM m`

const failAssistantSQL = `
UPDATE messages SET status = 'errored', error = $2, completed_at = now()
WHERE message_id = $1 AND status = 'pending'`
