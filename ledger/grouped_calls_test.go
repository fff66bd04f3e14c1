package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// groupedSession is a session of the grouped calls' tests: made in its
// own shape, then claimed with its first step and answered as the
// executor does, with the calls built as the executor builds them.
type groupedSession struct {
	id      string
	k       int // the shape
	read    ledger.SessionRead
	waiting []string // the head of the waiting inputs, as read
	inputs  []string // the turn's
	x       *ledger.Execution
}

// makeGroupedSession makes session id in shape k (fencing token 10k):
// k%3+1 waiting inputs,
// steers when k is odd (all of them in the head and in the turn, so that
// the answer releases the claim), queued when even (the oldest alone: the
// others wait, and the answer keeps the claim); then reads it as the
// executor does.
func makeGroupedSession(t *testing.T, b *testBundle, id string, k int) *groupedSession {
	t.Helper()
	ctx := context.Background()
	s := &groupedSession{id: id, k: k}
	// Each shape its own fencing token; the inputs' names sort against
	// their admission order, so that an order lost to a key's order shows.
	b.exec(t, `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, $2)`, id, 10*k)
	delivery := map[bool]string{true: "steer", false: "queue"}[k%2 == 1]
	for i := range k%3 + 1 {
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ($1, $2, $3, '\x00', $4, true)`, fmt.Sprintf("%s-in-%d", id, 9-i), id, fmt.Sprintf("prompt %d of %s", i, id), delivery)
	}
	var err error
	s.read, err = b.claims.Peek(ctx, id, nil)
	require.NoError(t, err)
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT array_agg(message_id ORDER BY admission_seq) FROM promptline_waiting_head($1)`, id).Scan(&s.waiting))
	s.inputs = s.waiting
	if delivery == "queue" {
		s.inputs = s.waiting[:1]
	}
	return s
}

func (s *groupedSession) assistant() string { return s.id + "-a1" }
func (s *groupedSession) attempt() string   { return s.id + "-e/step-1" }

// rows are one or two outbox rows of s, in order.
func (s *groupedSession) rows(what string) ([]string, []string, [][]byte) {
	var rows []outbox.Row
	for i := range s.k%2 + 1 {
		rows = append(rows, outbox.Row{Topic: "session-events", Key: s.id, Payload: fmt.Appendf(nil, `{"%s":%d,"session":%q}`, what, i, s.id)})
	}
	return outbox.Columns(rows)
}

// claim takes s's claim with its first step, as the executor's
// claimFirstTurn does: one call of promptline_turn_first.
func (s *groupedSession) claim(ctx context.Context, b *testBundle) error {
	x, err := b.claims.AcquireAsReadCall(ctx, s.id, s.id+"-e", s.read, s.waiting, ledger.PhaseUnknown, s.assistant(),
		func(*ledger.Execution) ledger.Call {
			topics, keys, payloads := s.rows("started")
			model := map[bool]string{true: "model", false: ""}[s.k%2 == 0]
			return ledger.Call{Func: "promptline_turn_first", Args: []any{
				s.inputs, s.id + "-t1", s.attempt(), "scripted", s.attempt(), fmt.Appendf(nil, "hash-%d", s.k), model, int64(7 + s.k),
				topics, keys, payloads,
			}}
		})
	s.x = x
	return err
}

// next writes the first step of s's next turn, oldest (the oldest input
// waiting, read before: the flushes hold the pool), under the claim s
// holds, as the executor's promoteQueued does: one call of
// promptline_turn_next.
func (s *groupedSession) next(ctx context.Context, oldest string) error {
	topics, keys, payloads := s.rows("next")
	attempt := s.id + "-e/step-2"
	return s.x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseUnknown, s.id+"-a2", ledger.Call{Func: "promptline_turn_next", Args: []any{
		[]string{oldest}, s.id + "-t2", attempt, "scripted", attempt, fmt.Appendf(nil, "hash-2-%d", s.k), "model", int64(11 + s.k),
		topics, keys, payloads,
	}}, nil)
}

// answer records s's answer with the release, as the executor's
// recordResponse does: one call of promptline_turn_answer. Its text is
// empty in shape 2 (mod 3), its response ID in odd shapes.
func (s *groupedSession) answer(ctx context.Context) (released bool, err error) {
	topics, keys, payloads := s.rows("answered")
	text := map[bool]string{true: "", false: "the answer of " + s.id}[s.k%3 == 2]
	response := map[bool]string{true: "", false: "resp-" + s.id}[s.k%2 == 1]
	return s.x.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, s.assistant(), ledger.Call{Func: "promptline_turn_answer",
		Args: []any{s.attempt(), int64(3 + s.k), int64(5), response, s.assistant(), text, topics, keys, payloads}})
}

// sendTogether sends send(s) for each of sessions while every flush is
// occupied, so that they go out in one flush; wait returns each one's
// result.
func sendTogether[T any](t *testing.T, b *testBundle, sessions []*groupedSession, send func(s *groupedSession) (T, error)) (wait func() ([]T, []error)) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	release := occupyFlushes(t, b)
	results := make([]chan result, len(sessions))
	for i, s := range sessions {
		results[i] = make(chan result, 1)
		go func() {
			v, err := send(s)
			results[i] <- result{v, err}
		}()
	}
	require.Eventually(t, func() bool { return ledger.GroupCommitQueued(b.claims) == len(sessions) }, 20*time.Second, 5*time.Millisecond,
		"the calls wait together for a flush")
	release()
	return func() ([]T, []error) {
		vs, errs := make([]T, len(sessions)), make([]error, len(sessions))
		for i := range results {
			r := <-results[i]
			vs[i], errs[i] = r.v, r.err
		}
		return vs, errs
	}
}

// together is sendTogether, waited for.
func together[T any](t *testing.T, b *testBundle, sessions []*groupedSession, send func(s *groupedSession) (T, error)) ([]T, []error) {
	t.Helper()
	return sendTogether(t, b, sessions, send)()
}

func claimOf(ctx context.Context, b *testBundle) func(s *groupedSession) (struct{}, error) {
	return func(s *groupedSession) (struct{}, error) { return struct{}{}, s.claim(ctx, b) }
}

func nextOf(ctx context.Context, oldest map[*groupedSession]string) func(s *groupedSession) (struct{}, error) {
	return func(s *groupedSession) (struct{}, error) { return struct{}{}, s.next(ctx, oldest[s]) }
}

func answerOf(ctx context.Context) func(s *groupedSession) (bool, error) {
	return func(s *groupedSession) (bool, error) { return s.answer(ctx) }
}

// The calls of several sessions sent grouped (each its opening, their
// writes together: promptline_turn_writes_group and
// promptline_turn_answer_writes_group, migration 00024) write what each
// session's own call writes: sessions of different
// shapes (one to three inputs, queued or steered, one or two outbox rows,
// a model or none, an answer's text and response ID or none, a response
// ID recorded before the answer or not, a claim released or kept for a
// waiting input) are claimed and answered grouped (and the kept claims'
// next turns begun),
// and the same shapes again one by one; after each, every row each
// session has must be the same, less the session's name, times and
// sequence numbers (their order within the session counts: the
// promotions, the messages, the outbox rows).
func TestGroupedCallsWriteWhatTheCallsWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	const n = 6
	var grouped, alone []*groupedSession
	for k := range n {
		grouped = append(grouped, makeGroupedSession(t, b, fmt.Sprintf("grouped-%d", k), k))
		alone = append(alone, makeGroupedSession(t, b, fmt.Sprintf("alone-%d", k), k))
	}
	// The snapshot ranks write_seq among the session's claims, one: the
	// kept claims' positions are compared as they are (a fence applies
	// its write's position).
	positions := func(stage string) {
		t.Helper()
		for k := range n {
			var g, a *int64
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT write_seq FROM claims WHERE session_id = $1),
				(SELECT write_seq FROM claims WHERE session_id = $2)`, grouped[k].id, alone[k].id).Scan(&g, &a))
			require.Equal(t, a, g, "%s, shape %d: the claim's write position", stage, k)
			require.Equal(t, a != nil, k%2 == 0 && k%3 != 0, "%s, shape %d: a kept claim has a position", stage, k)
		}
	}
	compare := func(stage string) {
		t.Helper()
		for k := range n {
			g, a := grouped[k].id, alone[k].id
			want := strings.ReplaceAll(testkit.Snapshot(t, b.pool, a), a, "S")
			require.Equal(t, want, strings.ReplaceAll(testkit.Snapshot(t, b.pool, g), g, "S"), "%s, shape %d", stage, k)
			require.Contains(t, want, `"role": "assistant"`, "the snapshot sees the rows")
		}
	}

	_, errs := together(t, b, grouped, claimOf(ctx, b))
	for i, err := range errs {
		require.NoError(t, err, grouped[i].id)
	}
	require.EqualValues(t, n, ledger.GroupCommitGrouped(b.claims), "the six first steps' writes went out grouped")
	for _, s := range grouped {
		var expires time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT expires_at FROM claims WHERE session_id = $1`, s.id).Scan(&expires))
		require.True(t, expires.Equal(s.x.Claim().ExpiresAt), "%s: its own claim's expiry, %v, not %v", s.id, expires, s.x.Claim().ExpiresAt)
	}
	for _, s := range alone {
		require.NoError(t, s.claim(ctx, b), s.id)
	}
	require.EqualValues(t, n, ledger.GroupCommitGrouped(b.claims), "each went out whole")
	compare("the claims with the first steps")
	// Shapes 1 and 4 had their response ID recorded while streaming: the
	// answer's own must not replace it.
	for _, s := range append(grouped, alone...) {
		if s.k%3 == 1 {
			b.exec(t, `UPDATE attempts SET response_id = 'streamed', response_id_at = now() WHERE attempt_id = $1`, s.attempt())
		}
	}

	releasedGrouped, errs := together(t, b, grouped, answerOf(ctx))
	for i, err := range errs {
		require.NoError(t, err, grouped[i].id)
	}
	require.EqualValues(t, 2*n, ledger.GroupCommitGrouped(b.claims), "the six answers' writes went out grouped")
	for k, s := range alone {
		released, err := s.answer(ctx)
		require.NoError(t, err, s.id)
		require.Equal(t, released, releasedGrouped[k], "shape %d: released as alone", k)
		require.Equal(t, k%2 == 1 || k%3 == 0, released, "shape %d: released unless an input waits", k)
		require.Equal(t, released, grouped[k].x.Fenced(), "shape %d: a released claim fences its execution", k)
	}
	require.EqualValues(t, 2*n, ledger.GroupCommitGrouped(b.claims), "each went out whole")
	compare("the answers with the releases")
	positions("the answers")

	// The claims kept (shapes 2 and 4: inputs wait) go on with the next
	// turn's first step under the claim.
	var keptGrouped, keptAlone []*groupedSession
	oldest := map[*groupedSession]string{}
	for k := range n {
		if !releasedGrouped[k] {
			keptGrouped, keptAlone = append(keptGrouped, grouped[k]), append(keptAlone, alone[k])
			for _, s := range []*groupedSession{grouped[k], alone[k]} {
				var id string
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT message_id FROM promptline_waiting_head($1) ORDER BY admission_seq LIMIT 1`,
					s.id).Scan(&id))
				oldest[s] = id
			}
		}
	}
	require.Len(t, keptGrouped, 2)
	_, errs = together(t, b, keptGrouped, nextOf(ctx, oldest))
	for i, err := range errs {
		require.NoError(t, err, keptGrouped[i].id)
	}
	require.EqualValues(t, 2*n+2, ledger.GroupCommitGrouped(b.claims), "the next turns' writes went out grouped")
	for _, s := range keptAlone {
		require.NoError(t, s.next(ctx, oldest[s]), s.id)
	}
	require.EqualValues(t, 2*n+2, ledger.GroupCommitGrouped(b.claims), "each went out whole")
	compare("the next turns' first steps")
	positions("the next turns' first steps")
	_, separated := ledger.GroupCommitCounts(b.claims)
	require.Zero(t, separated, "nothing was refused")
}

// A refusal in a flush of grouped calls (one session's first step on a
// read gone stale, one session's answer from a claim lost, one session's
// next turn from a claim lost, refused in their openings; one session's
// attempt ID already taken, refused in the grouped writes) rolls the whole transaction back, and each session
// is sent again alone: only the refused one fails; the others' calls
// commit, each as its own.
func TestGroupedCallRefusedIsSentAgainAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	var sessions []*groupedSession
	for k := range 4 {
		sessions = append(sessions, makeGroupedSession(t, b, fmt.Sprintf("s-%d", k), k))
	}
	stale := sessions[2]
	b.exec(t, `UPDATE sessions SET fencing_token = fencing_token + 1 WHERE session_id = $1`, stale.id)
	_, errs := together(t, b, sessions, claimOf(ctx, b))
	for i, s := range sessions {
		if s == stale {
			require.ErrorIs(t, errs[i], ledger.ErrStale, s.id)
			require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE session_id = $1`, s.id), "nothing of the stale session committed")
			continue
		}
		require.NoError(t, errs[i], s.id)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, s.id), s.id)
	}
	require.EqualValues(t, 4, ledger.GroupCommitGrouped(b.claims), "their writes went out grouped first")
	_, separated := ledger.GroupCommitCounts(b.claims)
	require.EqualValues(t, 1, separated, "refused, then each sent alone")

	claimed := []*groupedSession{sessions[0], sessions[1], sessions[3]}
	lost := claimed[1]
	b.expire(t, lost.id)
	_, errs = together(t, b, claimed, answerOf(ctx))
	for i, s := range claimed {
		if s == lost {
			require.ErrorIs(t, errs[i], ledger.ErrFenced, s.id)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'`, s.id),
				"nothing of the fenced answer committed")
			continue
		}
		require.NoError(t, errs[i], s.id)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'succeeded'`, s.id), s.id)
	}
	require.EqualValues(t, 4+3, ledger.GroupCommitGrouped(b.claims), "their writes went out grouped first")
	_, separated = ledger.GroupCommitCounts(b.claims)
	require.EqualValues(t, 2, separated, "refused, then each sent alone")

	// A refusal in the grouped writes themselves (an attempt's ID taken:
	// a key violated), after every opening and its callback ran: rolled
	// back, each sent alone, only the session at fault refused.
	var again []*groupedSession
	for k := range 3 {
		again = append(again, makeGroupedSession(t, b, fmt.Sprintf("w-%d", k), k))
	}
	taken := again[1]
	b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
		idempotency_key, fencing_token, request_hash, state) VALUES ($1, 's-0', 'other', 'other', 1, 'p', 'k', 1, '\x00', 'failed')`,
		taken.attempt())
	_, errs = together(t, b, again, claimOf(ctx, b))
	for i, s := range again {
		if s == taken {
			require.ErrorContains(t, errs[i], "23505", s.id)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, s.id), "nothing of it committed")
			continue
		}
		require.NoError(t, errs[i], s.id)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, s.id), s.id)
	}
	_, separated = ledger.GroupCommitCounts(b.claims)
	require.EqualValues(t, 3, separated, "refused in the writes, then each sent alone")

	// A later turn's first step from a claim lost, refused by its fence
	// (the grouped call's opening).
	kept := []*groupedSession{makeGroupedSession(t, b, "n-2", 2), makeGroupedSession(t, b, "n-4", 4)}
	oldest := map[*groupedSession]string{}
	for _, s := range kept {
		require.NoError(t, s.claim(ctx, b), s.id)
		released, err := s.answer(ctx)
		require.NoError(t, err, s.id)
		require.False(t, released, "%s: inputs wait", s.id)
		var id string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT message_id FROM promptline_waiting_head($1) ORDER BY admission_seq LIMIT 1`,
			s.id).Scan(&id))
		oldest[s] = id
	}
	gone := kept[0]
	b.expire(t, gone.id)
	_, errs = together(t, b, kept, nextOf(ctx, oldest))
	require.ErrorIs(t, errs[0], ledger.ErrFenced, gone.id)
	require.True(t, gone.x.Fenced())
	require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1`, gone.id+"-a2"), "nothing of the fenced turn committed")
	require.NoError(t, errs[1], kept[1].id)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1`, kept[1].id+"-a2"))
	_, separated = ledger.GroupCommitCounts(b.claims)
	require.EqualValues(t, 4, separated, "refused by a fence, then each sent alone")
}

// admissionTx is a transaction on a connection of its own, outside b's
// pool (the flushes occupy the pool's), standing for admission's.
func admissionTx(t *testing.T, b *testBundle) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// A flush's grouped calls keep the byte order of its sessions' locks, in
// which admission locks the sessions of its batch: with an admission
// holding session a's row and about to lock z's, a flush with a's answer
// and y's and z's first steps waits for a before it locks y or z, and
// neither waits for the other for good (a deadlock would roll one back).
func TestGroupedCallsKeepTheSessionsLockOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	a, y, z := makeGroupedSession(t, b, "a", 1), makeGroupedSession(t, b, "y", 2), makeGroupedSession(t, b, "z", 3)
	require.NoError(t, a.claim(ctx, b))
	admission := admissionTx(t, b)
	upsert := `INSERT INTO sessions (session_id) VALUES ($1) ON CONFLICT (session_id) DO UPDATE SET last_admitted_at = now()`
	_, err := admission.Exec(ctx, upsert, a.id)
	require.NoError(t, err)

	wait := sendTogether(t, b, []*groupedSession{a, y, z}, func(s *groupedSession) (any, error) {
		if s == a {
			return s.answer(ctx)
		}
		return nil, s.claim(ctx, b)
	})
	require.Eventually(t, func() bool {
		// a's answer is its own call: the flush holds no other answer.
		return b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%promptline_turn_answer(%'`) == 1
	}, 10*time.Second, 5*time.Millisecond, "a's answer waits for a's row")
	lockCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = admission.Exec(lockCtx, upsert, z.id)
	require.NoError(t, err, "the flush holds no row the admission locks after a's")
	require.NoError(t, admission.Commit(ctx))
	_, errs := wait()
	for i, err := range errs {
		require.NoError(t, err, []string{"a", "y", "z"}[i])
	}
	_, separated := ledger.GroupCommitCounts(b.claims)
	require.Zero(t, separated, "nothing was rolled back")
	require.EqualValues(t, 2, ledger.GroupCommitGrouped(b.claims), "y's and z's writes went out grouped")
}

// A grouped answer's release waits for the session's lock, then sees an
// input admitted while it waited, as a lone call's does
// (TestCallsOpenAsTheirDocSays): the claim stays for it.
func TestGroupedReleaseSeesAnInputAdmittedWhileItWaitedForTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	s0, s1 := makeGroupedSession(t, b, "s0", 1), makeGroupedSession(t, b, "s1", 3)
	for _, s := range []*groupedSession{s0, s1} {
		require.NoError(t, s.claim(ctx, b))
	}
	admission := admissionTx(t, b)
	_, err := admission.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1) ON CONFLICT (session_id) DO UPDATE SET last_admitted_at = now()`, s1.id)
	require.NoError(t, err)
	_, err = admission.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		VALUES ('late', $1, 'x', '\x00', 'queue', true)`, s1.id)
	require.NoError(t, err)
	wait := sendTogether(t, b, []*groupedSession{s0, s1}, answerOf(ctx))
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%promptline_finish_release%'`) == 1
	}, 10*time.Second, 5*time.Millisecond, "s1's answer waits for s1's row")
	require.NoError(t, admission.Commit(ctx))
	released, errs := wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.True(t, released[0], "nothing waits for s0")
	require.False(t, released[1], "the input admitted meanwhile waits: the claim stays for it")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND phase = 'safe'`, s1.id))
	require.False(t, s1.x.Fenced())
	require.EqualValues(t, 2, ledger.GroupCommitGrouped(b.claims), "the answers' writes went out grouped")
}
