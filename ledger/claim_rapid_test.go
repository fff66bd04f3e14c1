package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// claimMachine drives real claims on the real schema with random
// interleavings of admit, promote, acquire, read and acquire as read,
// renew, expire, takeover, write, step and release over a few sessions. It
// keeps a model of each session's claim and checks after every step that
// the claim rows are exactly the model (acquisition never replaces a
// claim, live or expired; only the takeover's compare-and-swap does; a
// release deletes its own claim only), that the session's token is the
// last one granted and a claim carries it (tokens only grow), that an
// expired claim is never renewed, that a claim only names assistant
// messages that exist, that a fenced writer's writes are never visible,
// and that no claim is released while inputs wait unless a wake was
// written with it. Each action also checks its own outcome: a write
// succeeds exactly when its execution holds the session's claim with a
// live lease.
type claimMachine struct {
	pool     *pgxpool.Pool
	claims   *ledger.Claims
	prefix   string
	sessions []string
	execs    []*ledger.Execution
	tokens   map[string]int64       // highest token granted per session
	model    map[string]*modelClaim // the claim each session should hold
	wakes    map[string]int         // wakes written by releases per session
	probes   map[string]int         // writes committed by holders per session
	reads    []sessionRead          // sessions as read without a claim, for AcquireAsRead
	seq      int
}

// modelClaim is what the machine expects of a session's claim row.
type modelClaim struct {
	execution string
	token     int64
	expired   bool // the machine let its lease lapse; nothing may renew it
}

// sessionRead is a session as Peek read it.
type sessionRead struct {
	session string
	read    ledger.SessionRead
	waiting []string
}

var machineRun atomic.Int64

func newClaimMachine(t *rapid.T, pool *pgxpool.Pool) *claimMachine {
	m := &claimMachine{
		pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "m"}),
		prefix: fmt.Sprintf("r%d-", machineRun.Add(1)),
		tokens: map[string]int64{}, model: map[string]*modelClaim{}, wakes: map[string]int{}, probes: map[string]int{},
	}
	for i := range 3 {
		s := fmt.Sprintf("%ss%d", m.prefix, i)
		m.sessions = append(m.sessions, s)
		m.must(t, `INSERT INTO sessions (session_id) VALUES ($1)`, s)
	}
	return m
}

func (m *claimMachine) must(t *rapid.T, sql string, args ...any) {
	if _, err := m.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (m *claimMachine) current(t *rapid.T, s string) (ledger.Claim, bool, bool) {
	ctx := context.Background()
	c, ok, err := ledger.Get(ctx, m.pool, s)
	if err != nil {
		t.Fatal(err)
	}
	live := false
	if ok {
		if err := m.pool.QueryRow(ctx, `SELECT expires_at > now() FROM claims WHERE session_id = $1`, s).Scan(&live); err != nil {
			t.Fatal(err)
		}
	}
	return c, ok, live
}

// Admit adds a queued prompt, a steer or a continuation: each changes the
// head of the waiting inputs (AcquireAsRead's check) in its own way.
func (m *claimMachine) Admit(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	delivery, kind := "queue", "prompt"
	switch rapid.IntRange(0, 5).Draw(t, "what") {
	case 0:
		delivery = "steer"
	case 1:
		kind = "continuation"
	}
	m.seq++
	m.must(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
		VALUES ($1, $2, 'x', '\x00', $3, true, $4)`, fmt.Sprintf("%sin%d", m.prefix, m.seq), s, delivery, kind)
}

func (m *claimMachine) Promote(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.must(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq')
		WHERE message_id = (SELECT message_id FROM inputs WHERE session_id = $1 AND promotion_seq IS NULL ORDER BY admission_seq LIMIT 1)`, s)
}

// Acquire is the executor's claim on a wake (AcquireWaiting): it claims
// exactly when an input waits and the session holds no claim, live or
// expired.
func (m *claimMachine) Acquire(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	_, had, _ := m.current(t, s)
	_, _, waiting := m.state(t, s)
	m.seq++
	x, err := m.claims.AcquireWaiting(context.Background(), s, fmt.Sprintf("%se%d", m.prefix, m.seq), nil)
	switch {
	case len(waiting) == 0:
		if !errors.Is(err, ledger.ErrNothingWaiting) {
			t.Fatalf("acquire with no input waiting (claimed %v): %v", had, err)
		}
		return
	case had:
		if !errors.Is(err, ledger.ErrClaimHeld) {
			t.Fatalf("acquire over an existing claim: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("acquire on a free session with %d waiting: %v", len(waiting), err)
	}
	if x.Claim().Token <= m.tokens[s] {
		t.Fatalf("token %d did not grow past %d", x.Claim().Token, m.tokens[s])
	}
	m.granted(x)
}

// granted records a claim the machine was given.
func (m *claimMachine) granted(x *ledger.Execution) {
	c := x.Claim()
	m.tokens[c.SessionID] = c.Token
	m.model[c.SessionID] = &modelClaim{execution: c.ExecutionID, token: c.Token}
	m.execs = append(m.execs, x)
}

// state reads what a claim taken as read depends on: the session's token,
// whether a claim exists, and the head of the waiting inputs in admission
// order (promptline_waiting_head).
func (m *claimMachine) state(t *rapid.T, s string) (token int64, claimed bool, waiting []string) {
	if err := m.pool.QueryRow(context.Background(), `SELECT fencing_token, EXISTS (SELECT 1 FROM claims WHERE session_id = $1),
		(`+headSQL+`) FROM sessions WHERE session_id = $1`, s).Scan(&token, &claimed, &waiting); err != nil {
		t.Fatal(err)
	}
	return token, claimed, waiting
}

func (m *claimMachine) Peek(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	r, waiting, err := peekWaiting(m.claims, s)
	if err != nil {
		t.Fatal(err)
	}
	m.reads = append(m.reads, sessionRead{session: s, read: r, waiting: waiting})
}

// AcquireAsRead succeeds exactly when nothing it depends on changed since
// the read, and then only on a free session, with a token that grew.
func (m *claimMachine) AcquireAsRead(t *rapid.T) {
	if len(m.reads) == 0 {
		return // nothing read yet
	}
	rd := rapid.SampledFrom(m.reads).Draw(t, "read")
	token, claimed, waiting := m.state(t, rd.session)
	same := !rd.read.Claimed && !claimed && token == rd.read.Token && len(waiting) > 0 && slices.Equal(waiting, rd.waiting)
	m.seq++
	// As the executor's first turn: the claim names the assistant message
	// created in the same round trip.
	asst := fmt.Sprintf("%sam%d", m.prefix, m.seq)
	x, err := m.claims.AcquireAsRead(context.Background(), rd.session, fmt.Sprintf("%sa%d", m.prefix, m.seq), rd.read, rd.waiting,
		ledger.PhaseUnknown, asst, func(b *pgx.Batch, _ *ledger.Execution) { b.Queue(insertMessageSQL, asst, rd.session) })
	if !same {
		if !errors.Is(err, ledger.ErrStale) {
			t.Fatalf("claim taken on a changed session (read %+v %v, now token %d claimed %v %v): %v",
				rd.read, rd.waiting, token, claimed, waiting, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("claim as read of an unchanged free session: %v", err)
	}
	if x.Claim().Token <= m.tokens[rd.session] {
		t.Fatalf("token %d did not grow past %d", x.Claim().Token, m.tokens[rd.session])
	}
	m.granted(x)
}

func (m *claimMachine) Expire(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.must(t, `UPDATE claims SET expires_at = now() - interval '1 millisecond' WHERE session_id = $1`, s)
	if c := m.model[s]; c != nil {
		c.expired = true
	}
}

func (m *claimMachine) Takeover(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	c, ok, live := m.current(t, s)
	if !ok {
		return
	}
	m.seq++
	var nc ledger.Claim
	err := pgdb.InTx(context.Background(), m.pool, func(tx pgx.Tx) error {
		var err error
		nc, err = ledger.Takeover(context.Background(), tx, c, fmt.Sprintf("%srec%d", m.prefix, m.seq), "recovery", time.Minute)
		return err
	})
	if live {
		if !errors.Is(err, ledger.ErrNotExpired) {
			t.Fatalf("takeover of a live claim: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("takeover of an expired claim: %v", err)
	}
	if nc.Token <= m.tokens[s] {
		t.Fatalf("takeover token %d did not grow past %d", nc.Token, m.tokens[s])
	}
	m.tokens[s] = nc.Token
	m.model[s] = &modelClaim{execution: nc.ExecutionID, token: nc.Token}
	if rapid.Bool().Draw(t, "clear") {
		// Recovery, standing in: clear the claim.
		m.must(t, `DELETE FROM claims WHERE session_id = $1 AND fencing_token = $2`, s, nc.Token)
		delete(m.model, s)
	}
}

// Write and Renew: succeed exactly when the execution holds a live claim.
func (m *claimMachine) Write(t *rapid.T) {
	if len(m.execs) == 0 {
		return // nothing to act on yet
	}
	x := rapid.SampledFrom(m.execs).Draw(t, "execution")
	c, ok, live := m.current(t, x.Claim().SessionID)
	holder := ok && live && c.ExecutionID == x.Claim().ExecutionID && c.Token == x.Claim().Token && !x.Fenced()
	var err error
	if rapid.Bool().Draw(t, "renew") {
		err = x.Renew(context.Background())
	} else {
		// The write leaves a probe row: Check counts them against the
		// holders' writes.
		err = x.Write(context.Background(), func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('probe', $1, $2)`,
				x.Claim().SessionID, []byte(x.Claim().ExecutionID))
			return err
		})
		if err == nil {
			m.probes[x.Claim().SessionID]++
		}
	}
	if holder && err != nil {
		t.Fatalf("the holder's write failed: %v", err)
	}
	if !holder && !errors.Is(err, ledger.ErrFenced) {
		t.Fatalf("a write with token %d (claim %+v, live %v) was not fenced: %v", x.Claim().Token, c, live, err)
	}
}

func (m *claimMachine) Release(t *rapid.T) {
	if len(m.execs) == 0 {
		return // nothing to act on yet
	}
	x := rapid.SampledFrom(m.execs).Draw(t, "execution")
	stopping := rapid.Bool().Draw(t, "stopping")
	s := x.Claim().SessionID
	c, ok, live := m.current(t, s)
	holder := ok && live && c.ExecutionID == x.Claim().ExecutionID && !x.Fenced()
	var waiting int
	if err := m.pool.QueryRow(context.Background(), `SELECT count(*) FROM inputs WHERE session_id = $1 AND promotion_seq IS NULL AND wake_pending`, s).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	released, err := x.Release(context.Background(), ledger.ReleaseOpts{
		Stopping: stopping, Wake: outbox.Row{Topic: "wakes", Key: s, Payload: []byte("{}")},
	})
	switch {
	case !holder:
		if !errors.Is(err, ledger.ErrFenced) || released {
			t.Fatalf("a non-holder released: released=%v err=%v", released, err)
		}
	case err != nil:
		t.Fatalf("the holder's release failed: %v", err)
	case waiting > 0 && !stopping && released:
		t.Fatalf("released with %d waiting inputs while not stopping", waiting)
	case (waiting == 0 || stopping) && !released:
		t.Fatalf("did not release (waiting %d, stopping %v)", waiting, stopping)
	}
	if released {
		delete(m.model, s)
		if waiting > 0 {
			m.wakes[s]++
		}
	}
}

var errAbandoned = errors.New("step abandoned")

// Step is an execution's step: the phase continue naming a new assistant
// message, created in the same transaction (Write) or round trip
// (WriteQueued); abandoned, the transaction fails after the phase was set
// and before or instead of the message, and nothing of it may remain.
func (m *claimMachine) Step(t *rapid.T) {
	if len(m.execs) == 0 {
		return // nothing to act on yet
	}
	x := rapid.SampledFrom(m.execs).Draw(t, "execution")
	queued := rapid.Bool().Draw(t, "queued")
	abandon := rapid.Bool().Draw(t, "abandon")
	s := x.Claim().SessionID
	c, ok, live := m.current(t, s)
	holder := ok && live && c.ExecutionID == x.Claim().ExecutionID && c.Token == x.Claim().Token && !x.Fenced()
	m.seq++
	asst := fmt.Sprintf("%ssm%d", m.prefix, m.seq)
	ctx := context.Background()
	var err error
	if queued {
		err = x.WriteQueued(ctx, ledger.PhaseContinue, asst, func(b *pgx.Batch) {
			if abandon {
				b.Queue(`SELECT 1 / 0`)
			}
			b.Queue(insertMessageSQL, asst, s)
		})
	} else {
		err = x.Write(ctx, func(tx pgx.Tx) error {
			if err := x.SetPhase(ctx, tx, ledger.PhaseContinue, asst); err != nil {
				return err
			}
			if abandon {
				return errAbandoned
			}
			_, err := tx.Exec(ctx, insertMessageSQL, asst, s)
			return err
		})
	}
	switch {
	case !holder:
		if !errors.Is(err, ledger.ErrFenced) {
			t.Fatalf("a step with token %d (claim %+v, live %v) was not fenced: %v", x.Claim().Token, c, live, err)
		}
	case abandon:
		if err == nil || errors.Is(err, ledger.ErrFenced) {
			t.Fatalf("an abandoned step of the holder: %v", err)
		}
	case err != nil:
		t.Fatalf("the holder's step failed: %v", err)
	}
}

const insertMessageSQL = `INSERT INTO messages (message_id, session_id, role, status) VALUES ($1, $2, 'assistant', 'pending')`

func (m *claimMachine) Check(t *rapid.T) {
	ctx := context.Background()
	for _, s := range m.sessions {
		var token int64
		var exec, asst *string
		var claimToken *int64
		var expired, asstExists *bool
		if err := m.pool.QueryRow(ctx, `SELECT s.fencing_token, c.execution_id, c.fencing_token, c.expires_at <= now(),
				nullif(c.assistant_message_id, ''), EXISTS (SELECT 1 FROM messages m WHERE m.message_id = c.assistant_message_id)
			FROM sessions s LEFT JOIN claims c ON c.session_id = s.session_id WHERE s.session_id = $1`, s).
			Scan(&token, &exec, &claimToken, &expired, &asst, &asstExists); err != nil {
			t.Fatal(err)
		}
		if token != m.tokens[s] {
			t.Fatalf("%s: session token %d, the last one granted is %d", s, token, m.tokens[s])
		}
		want := m.model[s]
		switch {
		case want == nil && exec != nil:
			t.Fatalf("%s: claim of %s (token %d) where none should be", s, *exec, *claimToken)
		case want != nil && exec == nil:
			t.Fatalf("%s: the claim of %s (token %d) is gone", s, want.execution, want.token)
		case want != nil && (*exec != want.execution || *claimToken != want.token):
			t.Fatalf("%s: claim of %s (token %d) replaced by %s (token %d)", s, want.execution, want.token, *exec, *claimToken)
		}
		if want != nil && want.expired && !*expired {
			t.Fatalf("%s: the expired claim of %s was renewed", s, want.execution)
		}
		if asst != nil && !*asstExists {
			t.Fatalf("%s: the claim names assistant message %s, which does not exist", s, *asst)
		}
		var wakes, probes int
		if err := m.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE topic = 'wakes'), count(*) FILTER (WHERE topic = 'probe')
			FROM outbox WHERE key = $1`, s).Scan(&wakes, &probes); err != nil {
			t.Fatal(err)
		}
		if wakes != m.wakes[s] {
			t.Fatalf("%s: %d wakes in the outbox, %d releases with waiting input", s, wakes, m.wakes[s])
		}
		if probes != m.probes[s] {
			t.Fatalf("%s: %d writes visible, %d committed by holders: a fenced write landed", s, probes, m.probes[s])
		}
	}
}

func TestClaimStateMachine(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	rapid.Check(t, func(rt *rapid.T) {
		m := newClaimMachine(rt, pool)
		rt.Repeat(rapid.StateMachineActions(m))
	})
}
