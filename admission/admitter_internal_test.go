package admission

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/outbox"
)

func prompt(msg, sess, text string, resume bool) Incoming {
	return Incoming{Prompt: envelope.Prompt{MessageID: msg, SessionID: sess, Text: text, Resume: &resume}}
}

// Every copy of a message ID in a batch is classified against the stored
// row when there is one, as if each copy had come in a batch of its own
// (docs/design.md, P2, invariants 2 and 3).
func TestAdmitClassifiesEveryCopyAgainstTheStoredRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		pool *pgxpool.Pool
		a    *Admitter
	}
	setup := func(t *testing.T) *bundle {
		pool, _ := testkit.Pool(t)
		return &bundle{pool: pool, a: NewAdmitter(pool, &AdmitterConfig{})}
	}
	wakes := func(t *testing.T, b *bundle, sess string) int {
		return testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1`, sess)
	}

	t.Run("ExactRetryBehindAConflictArmsTheWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", false)})
		require.NoError(t, err)
		require.Zero(t, wakes(t, b, "s"))

		got, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "b", true), prompt("x", "s", "a", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict, Duplicate}, got)
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = 'x' AND text = 'a' AND wake_pending`),
			"the exact retry armed the wake (invariant 3); the conflict changed nothing")
		require.Equal(t, 1, wakes(t, b, "s"))
	})

	// A message ID that names a message promptline wrote (an assistant's
	// answer, a tool's result), of this session or another, would make the
	// prompt's user message collide with it when its turn is claimed:
	// every claim of the session would fail, for good. It is a conflict,
	// and changes nothing; a promoted prompt's own user message is not.
	t.Run("AnIDTakenByAMessageIsAConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		exec := func(sql string) {
			_, err := b.pool.Exec(ctx, sql)
			require.NoError(t, err)
		}
		exec(`INSERT INTO sessions (session_id) VALUES ('other')`)
		exec(`INSERT INTO messages (message_id, session_id, role, status) VALUES ('answer-1', 'other', 'assistant', 'completed')`)
		got, err := b.a.Admit(ctx, []Incoming{prompt("answer-1", "s", "a", true), prompt("fresh", "s", "b", true), prompt("answer-1", "t", "a", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict, Admitted, Conflict}, got)
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = 'answer-1'`))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 't'`), "a conflict creates no session (invariant 2)")
		require.Equal(t, 1, wakes(t, b, "s"), "the admitted prompt's")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE payload::text LIKE '%answer-1%'`))

		// A prompt's own user message does not make its retry a conflict.
		exec(`INSERT INTO messages (message_id, session_id, role, status) VALUES ('fresh', 's', 'user', 'completed')`)
		got, err = b.a.Admit(ctx, []Incoming{prompt("fresh", "s", "b", false)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Duplicate}, got)
	})

	// The same for an ID of a tool call's form before the call's result
	// is written (envelope.IsToolCallID): it will be, under that ID. Its
	// copies are conflicts too, and the batch's other prompts are decided
	// as alone.
	t.Run("AToolCallsIDIsAConflictBeforeItsResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		call := envelope.ToolCallID("01a252ff-00c9-77d7-83c4-f0dc705cbac5/step-2", 1)
		got, err := b.a.Admit(ctx, []Incoming{prompt(call, "t", "a", true), prompt("fresh", "s", "b", true),
			prompt(call, "t", "a", true), prompt("fresh", "s", "b", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict, Admitted, Conflict, Duplicate}, got)
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = $1`, call), "not stored")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 't'`), "the conflict's session is not created")
		require.Equal(t, 1, wakes(t, b, "s"))
		require.Zero(t, wakes(t, b, "t"))
		got, err = b.a.Admit(ctx, []Incoming{prompt(call, "t", "a", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict}, got, "alone too")
	})

	t.Run("EveryConflictingCopyIsAConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", true)})
		require.NoError(t, err)
		got, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "b", true), prompt("x", "s", "b", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict, Conflict}, got)
		require.Equal(t, 1, wakes(t, b, "s"), "no wake from the conflicts")
	})

	t.Run("NewIDCopiesAreClassifiedAgainstTheFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", false), prompt("x", "t", "a", true), prompt("x", "s", "a", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Admitted, Conflict, Duplicate}, got)
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = 'x' AND session_id = 's' AND wake_pending`))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 't'`), "the conflict's session is not created")
	})

	t.Run("ConflictFromAnotherSessionTouchesNoSession", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", false), prompt("y", "t", "t's own", false)})
		require.NoError(t, err)
		read := func() (s, t2 time.Time) {
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT last_admitted_at FROM sessions WHERE session_id = 's'),
				(SELECT last_admitted_at FROM sessions WHERE session_id = 't')`).Scan(&s, &t2))
			return s, t2
		}
		s0, t0 := read()
		got, err := b.a.Admit(ctx, []Incoming{prompt("x", "t", "a", true), prompt("x", "u", "a", true), prompt("x", "s", "b", true)})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Conflict, Conflict, Conflict}, got)
		s1, t1 := read()
		require.Equal(t, s0, s1, "a conflict does not touch the stored row's session")
		require.Equal(t, t0, t1, "a conflict does not touch its own session")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 'u'`), "nor creates it")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE wake_pending`))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`))
	})

	t.Run("LoserOfAConcurrentFirstAdmissionTouchesNoSession", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Another admission has inserted x (session w), not yet committed.
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('w')`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('x', 'w', 'a', $1, 'queue', true)`, envelope.Prompt{SessionID: "w", Text: "a"}.Hash())
		require.NoError(t, err)

		done := make(chan []Outcome, 1)
		go func() {
			got, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", true)})
			if err != nil {
				got = nil
			}
			done <- got
		}()
		require.Eventually(t, func() bool {
			return testkit.Count(t, b.pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO inputs%'`) == 1
		}, 5*time.Second, 5*time.Millisecond, "the admission waits on the uncommitted row")
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, []Outcome{Conflict}, <-done)
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 's'`), "the loser's session is not created")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox`))
	})

	t.Run("ThroughTheCombinedGroup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.a.Admit(ctx, []Incoming{prompt("x", "s", "a", false), prompt("m0", "blocked", "first", true)})
		require.NoError(t, err)
		g := NewGroup(b.a, 8, func([]outbox.Row) {})

		// Hold a session row: two transactions (maxAdmitInFlight) wait on
		// it, and the two partitions' batches behind them are combined.
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'blocked' FOR UPDATE`)
		require.NoError(t, err)
		batches := [][]Incoming{
			{prompt("b1", "blocked", "one", true)},
			{prompt("b2", "blocked", "two", true)},
			{prompt("x", "s", "b", true)},                              // partition 3: a conflict
			{prompt("x", "s", "a", true), prompt("x", "s", "b", true)}, // partition 4: the exact retry, another conflict
		}
		results := make([][]Outcome, len(batches))
		var wg sync.WaitGroup
		for i, batch := range batches {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := g.Admit(ctx, batch)
				if err == nil {
					results[i] = out
				}
			}()
			require.Eventually(t, func() bool {
				queued, running := g.queue.State()
				if i < 2 {
					return running == i+1 && queued == 0
				}
				return queued == i-1
			}, 5*time.Second, time.Millisecond)
		}
		require.NoError(t, tx.Rollback(ctx))
		wg.Wait()
		require.Equal(t, [][]Outcome{{Admitted}, {Admitted}, {Conflict}, {Duplicate, Conflict}}, results)
		require.Equal(t, int64(3), g.transactions.Load(), "the last two batches were combined")
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = 'x' AND text = 'a' AND wake_pending`))
		require.Equal(t, 1, wakes(t, b, "s"))
	})
}

// A batch admitted at once gives the outcomes, the rows and the wakes of
// the same prompts admitted one at a time, whatever came before it.
func TestAdmitBatchIsOneAtATime(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	a := NewAdmitter(pool, &AdmitterConfig{})
	ctx := context.Background()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		gen := rapid.Custom(func(rt *rapid.T) Incoming {
			return prompt(rapid.SampledFrom([]string{"x", "y", "z"}).Draw(rt, "id"),
				rapid.SampledFrom([]string{"s", "t"}).Draw(rt, "session"),
				rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "text"),
				rapid.Bool().Draw(rt, "resume"))
		})
		before := rapid.SliceOfN(gen, 0, 3).Draw(rt, "before")
		batch := rapid.SliceOfN(gen, 1, 6).Draw(rt, "batch")

		// Two namespaces of the same database: batched and one at a time.
		ns := func(kind string, in []Incoming) []Incoming {
			out := make([]Incoming, len(in))
			for i, p := range in {
				p.Prompt.MessageID = fmt.Sprintf("%s%d-%s", kind, n, p.Prompt.MessageID)
				p.Prompt.SessionID = fmt.Sprintf("%s%d-%s", kind, n, p.Prompt.SessionID)
				out[i] = p
			}
			return out
		}
		one := func(in []Incoming) []Outcome {
			var out []Outcome
			for _, p := range in {
				o, err := a.Admit(ctx, []Incoming{p})
				if err != nil {
					rt.Fatal(err)
				}
				out = append(out, o...)
			}
			return out
		}
		one(ns("b", before))
		one(ns("o", before))
		got, err := a.Admit(ctx, ns("b", batch))
		if err != nil {
			rt.Fatal(err)
		}
		want := one(ns("o", batch))
		require.Equal(rt, want, got)

		state := func(kind string) []string {
			rows, err := pool.Query(ctx, `
				SELECT 'input ' || substr(message_id, length($1) + 1) || ' ' || substr(session_id, length($1) + 1) || ' ' || text || ' ' || wake_pending
				FROM inputs WHERE message_id LIKE $1 || '%'
				UNION ALL SELECT 'session ' || substr(session_id, length($1) + 1) FROM sessions WHERE session_id LIKE $1 || '%'
				UNION ALL SELECT DISTINCT 'wake ' || substr(key, length($1) + 1) FROM outbox WHERE topic = 'wakes' AND key LIKE $1 || '%'
				ORDER BY 1`, fmt.Sprintf("%s%d-", kind, n))
			if err != nil {
				rt.Fatal(err)
			}
			var out []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					rt.Fatal(err)
				}
				out = append(out, s)
			}
			if err := rows.Err(); err != nil {
				rt.Fatal(err)
			}
			return out
		}
		require.Equal(rt, state("o"), state("b"))
	})
}

// OnCommitFunc (the relay's nudge) runs after a commit that wrote outbox
// rows, and only then: an exact retry whose wake is already pending and a
// conflicting reuse commit nothing for the relay to publish.
func TestOnCommitFuncOnlyAfterOutboxRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	var commits int
	a := NewAdmitter(pool, &AdmitterConfig{OnCommitFunc: func() { commits++ }})
	outboxRows := func() int { return testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE key = 's'`) }

	got, err := a.Admit(ctx, []Incoming{prompt("x", "s", "a", true)})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Admitted}, got)
	require.Equal(t, 2, outboxRows(), "input.admitted and its wake")
	require.Equal(t, 1, commits)

	got, err = a.Admit(ctx, []Incoming{prompt("x", "s", "a", true), prompt("x", "s", "b", true)})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate, Conflict}, got)
	require.Equal(t, 2, outboxRows(), "the wake was pending already; the conflict changes nothing")
	require.Equal(t, 1, commits, "no outbox row, no nudge")
}

// Admission runs a statement only when it has something to do: the read
// of the stored rows only for IDs admitted before, the arming only for
// retries that arm a wake. Each is a round trip on the path of every
// prompt (docs/benchmarks.md counts them per turn).
func TestAdmitRunsOnlyTheStatementsItNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testkit.DatabaseURL(t))
	require.NoError(t, err)
	sqls := &statementLog{}
	cfg.ConnConfig.Tracer = sqls
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	a := NewAdmitter(pool, &AdmitterConfig{})

	for _, c := range []struct {
		name       string
		batch      []Incoming
		want       []Outcome
		reads, arm int
	}{
		{"new prompts", []Incoming{prompt("x", "s", "a", false), prompt("y", "t", "a", true)}, []Outcome{Admitted, Admitted}, 0, 0},
		{"a retry that arms the wake", []Incoming{prompt("x", "s", "a", true)}, []Outcome{Duplicate}, 1, 1},
		{"retries that arm nothing", []Incoming{prompt("x", "s", "a", true), prompt("y", "t", "a", true)}, []Outcome{Duplicate, Duplicate}, 1, 0},
		{"a conflict", []Incoming{prompt("x", "s", "b", true)}, []Outcome{Conflict}, 1, 0},
	} {
		sqls.reset()
		got, err := a.Admit(ctx, c.batch)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.reads, sqls.count(selectExistingSQL), "%s: reads of the stored rows", c.name)
		require.Equal(t, c.arm, sqls.count(armSQL), "%s: arming statements", c.name)
	}
}

// statementLog records the SQL of every statement a pool sends, alone or
// in a batch.
type statementLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = append(l.sqls, sql)
}

func (l *statementLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = nil
}

func (l *statementLog) count(sql string) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.sqls {
		if s == sql {
			n++
		}
	}
	return n
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.add(data.SQL)
	return ctx
}
func (*statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (*statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	l.add(data.SQL)
}
func (*statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// The zero Outcome is none of the three: a prompt left unclassified never
// reads as admitted.
func TestTheZeroOutcomeIsNone(t *testing.T) {
	var zero Outcome
	require.NotContains(t, []Outcome{Admitted, Duplicate, Conflict}, zero)
	require.Equal(t, "unknown", zero.String())
	require.Equal(t, []string{"admitted", "duplicate", "conflict"}, []string{Admitted.String(), Duplicate.String(), Conflict.String()})
}
