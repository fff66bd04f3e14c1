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
// renew, expire, takeover, write and release over a few sessions, and checks after every step: at most one
// claim per session, tokens only grow, a write succeeds exactly when its
// execution holds the session's claim with a live lease, and no claim is
// released while inputs wait unless a wake was written with it.
type claimMachine struct {
	pool     *pgxpool.Pool
	claims   *ledger.Claims
	prefix   string
	sessions []string
	execs    []*ledger.Execution
	tokens   map[string]int64 // highest token seen per session
	wakes    map[string]int   // wakes written by releases per session
	reads    []sessionRead    // sessions as read without a claim, for AcquireAsRead
	seq      int
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
		tokens: map[string]int64{}, wakes: map[string]int{},
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

func (m *claimMachine) Admit(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.seq++
	m.must(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		VALUES ($1, $2, 'x', '\x00', 'queue', true)`, fmt.Sprintf("%sin%d", m.prefix, m.seq), s)
}

func (m *claimMachine) Promote(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.must(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq')
		WHERE message_id = (SELECT message_id FROM inputs WHERE session_id = $1 AND promotion_seq IS NULL ORDER BY admission_seq LIMIT 1)`, s)
}

func (m *claimMachine) Acquire(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	_, had, _ := m.current(t, s)
	m.seq++
	x, err := m.claims.Acquire(context.Background(), s, fmt.Sprintf("%se%d", m.prefix, m.seq), nil)
	if had {
		if !errors.Is(err, ledger.ErrClaimHeld) {
			t.Fatalf("acquire over an existing claim: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("acquire on a free session: %v", err)
	}
	if x.Claim().Token <= m.tokens[s] {
		t.Fatalf("token %d did not grow past %d", x.Claim().Token, m.tokens[s])
	}
	m.tokens[s] = x.Claim().Token
	m.execs = append(m.execs, x)
}

// state reads what a claim taken as read depends on: the session's token,
// whether a claim exists, and the waiting inputs in admission order.
func (m *claimMachine) state(t *rapid.T, s string) (token int64, claimed bool, waiting []string) {
	if err := m.pool.QueryRow(context.Background(), `SELECT fencing_token, EXISTS (SELECT 1 FROM claims WHERE session_id = $1),
		(SELECT array_agg(message_id ORDER BY admission_seq) FROM waiting_inputs WHERE session_id = $1)
		FROM sessions WHERE session_id = $1`, s).Scan(&token, &claimed, &waiting); err != nil {
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
	x, err := m.claims.AcquireAsRead(context.Background(), rd.session, fmt.Sprintf("%sa%d", m.prefix, m.seq), rd.read, rd.waiting,
		ledger.PhaseUnknown, "", func(*pgx.Batch, *ledger.Execution) {})
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
	m.tokens[rd.session] = x.Claim().Token
	m.execs = append(m.execs, x)
}

func (m *claimMachine) Expire(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.must(t, `UPDATE claims SET expires_at = now() - interval '1 millisecond' WHERE session_id = $1`, s)
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
	// Recovery, standing in: clear the claim, with a wake if input waits.
	m.must(t, `DELETE FROM claims WHERE session_id = $1 AND fencing_token = $2`, s, nc.Token)
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
		err = x.Write(context.Background(), func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `UPDATE sessions SET last_admitted_at = now() WHERE session_id = $1`, x.Claim().SessionID)
			return err
		})
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
	case released && waiting > 0:
		m.wakes[s]++
	}
}

func (m *claimMachine) Check(t *rapid.T) {
	ctx := context.Background()
	for _, s := range m.sessions {
		var claims int
		var token int64
		if err := m.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM claims WHERE session_id = $1), fencing_token FROM sessions WHERE session_id = $1`, s).Scan(&claims, &token); err != nil {
			t.Fatal(err)
		}
		if claims > 1 {
			t.Fatalf("%d claims on %s", claims, s)
		}
		if token < m.tokens[s] {
			t.Fatalf("session token went back: %d < %d", token, m.tokens[s])
		}
		var wakes int
		if err := m.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1`, s).Scan(&wakes); err != nil {
			t.Fatal(err)
		}
		if wakes != m.wakes[s] {
			t.Fatalf("%s: %d wakes in the outbox, %d releases with waiting input", s, wakes, m.wakes[s])
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
