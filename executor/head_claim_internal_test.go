package executor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// A claim taken as read (promptline_claim_as_read) compares the head of
// the waiting inputs (migration 00020), not the whole queue, and a turn
// is chosen from the head alone. The claim may refuse more than it must;
// it must never pass when the turn a fresh read of the whole queue would
// choose differs from the turn chosen from the head as read. The oracle
// here is written from the rules (docs/design.md, steers jump the queue
// oldest first, at most maxSteersPerTurn and maxSteerBytesPerTurn a turn;
// else the oldest; an internal input takes the transactional path), over
// every waiting input, not from promptline_waiting_head: random sessions,
// read, changed at random (an admission of each delivery and kind, an
// input numbered before the head but committed after the read, a
// quarantine, a release, a promotion, a permission request left pending
// or answered), then claimed.
func TestAClaimAsReadPassesOnlyForTheSameTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	big := strings.Repeat("x", 300<<10)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	// turnOf is the turn a fresh read of the whole queue chooses: "path:ID"
	// for an internal input, else the IDs it promotes.
	turnOf := func(t *testing.T, tx querier, s string) string {
		t.Helper()
		rows, err := tx.Query(ctx, `SELECT message_id, delivery, kind, octet_length(text) FROM waiting_inputs
			WHERE session_id = $1 ORDER BY admission_seq`, s)
		require.NoError(t, err)
		type w struct {
			id, delivery, kind string
			size               int
		}
		all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (w, error) {
			var x w
			return x, r.Scan(&x.id, &x.delivery, &x.kind, &x.size)
		})
		require.NoError(t, err)
		if len(all) == 0 {
			return "none"
		}
		for _, x := range all {
			if x.kind != "prompt" {
				return "path:" + x.id
			}
		}
		var pick []string
		n, bytes := 0, 0
		for _, x := range all {
			if x.delivery != "steer" {
				continue
			}
			if n >= maxSteersPerTurn || bytes >= maxSteerBytesPerTurn {
				break
			}
			pick = append(pick, x.id)
			n++
			bytes += x.size
		}
		if len(pick) == 0 {
			pick = []string{all[0].id}
		}
		return strings.Join(pick, ",")
	}
	// headTurn is the turn the executor chooses from the head it read.
	headTurn := func(v []waitingInput) string {
		if len(v) == 0 {
			return "none"
		}
		for _, w := range v {
			if w.kind != "prompt" {
				return "path:" + w.id
			}
		}
		var ids []string
		for _, w := range pickTurn(v) {
			ids = append(ids, w.id)
		}
		return strings.Join(ids, ",")
	}

	const trials = 150
	var passed, refused, wrong int
	for i := range trials {
		s := fmt.Sprintf("h%03d", i)
		exec(t, `INSERT INTO sessions (session_id) VALUES ($1)`, s)
		n := 0
		add := func(delivery, kind string, text string, seq *int64) string {
			n++
			id := fmt.Sprintf("%s-%02d", s, n)
			if seq != nil {
				exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind, admission_seq)
					OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, '\x00', $4, true, $5, $6)`, id, s, text, delivery, kind, *seq)
			} else {
				exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
					VALUES ($1, $2, $3, '\x00', $4, true, $5)`, id, s, text, delivery, kind)
			}
			return id
		}
		randomInput := func(seq *int64) string {
			delivery, kind, text := "queue", "prompt", "x"
			if rng.IntN(2) == 0 {
				delivery = "steer"
			}
			switch rng.IntN(8) {
			case 0:
				kind = "continuation"
			case 1:
				kind = "permission_reply"
			}
			if rng.IntN(4) == 0 {
				text = big
			}
			return add(delivery, kind, text, seq)
		}
		// park leaves a permission request of s pending; unpark answers it.
		park := func() {
			exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state) VALUES ($1 || '-a', $1, 'e0', 'm0', 1, 'p', 'k', 0, '\x00', 'started')
				ON CONFLICT DO NOTHING`, s)
			exec(t, `INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class, input,
				idempotency_key, fencing_token, state) VALUES ($1 || '-c', $1 || '-a', $1, 'e0', 0, 'mc', 'tool', 'idempotent', '{}', 'k', 0, 'requested')
				ON CONFLICT DO NOTHING`, s)
			exec(t, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
				VALUES ($1 || '-r', $1, $1 || '-c', 'tool', 'tool', 'pending')
				ON CONFLICT (request_id) DO UPDATE SET status = 'pending', reply = NULL`, s)
		}
		unpark := func() {
			exec(t, `UPDATE permission_requests SET status = 'approved', reply = 'once' WHERE session_id = $1`, s)
		}
		if rng.IntN(5) == 0 {
			park()
		}
		for range rng.IntN(6) {
			randomInput(nil)
		}
		if rng.IntN(5) == 0 { // past the hundredth steer
			for range maxSteersPerTurn - 2 + rng.IntN(4) {
				add("steer", "prompt", "x", nil)
			}
			for range rng.IntN(3) {
				randomInput(nil)
			}
		}
		rows, err := pool.Query(ctx, `SELECT message_id FROM inputs WHERE session_id = $1 ORDER BY admission_seq`, s)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		if len(ids) > 0 && rng.IntN(4) == 0 {
			exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = $1`, ids[rng.IntN(len(ids))])
		}

		// The read, as claimFirstTurn reads.
		r, err := pool.Query(ctx, waitingSQL, s, maxSteersPerTurn, maxSteerBytesPerTurn)
		require.NoError(t, err)
		head, err := scanWaiting(r)
		require.NoError(t, err)
		read := headTurn(head)
		require.Equal(t, turnOf(t, pool, s), read, "session %s: the head chooses the turn the whole queue chooses", s)
		headIDs := make([]string, len(head))
		for j, w := range head {
			headIDs[j] = w.id
		}

		// A change.
		change := rng.IntN(10)
		switch {
		case change == 0:
			randomInput(nil)
		case change == 1:
			lo := -int64(i + 1) // numbered before the read's inputs, committed after it
			randomInput(&lo)
		case change == 2 && len(ids) > 0:
			exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = $1`, ids[rng.IntN(len(ids))])
		case change == 3 && len(ids) > 0:
			exec(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq') WHERE message_id = $1`, ids[rng.IntN(len(ids))])
		case change == 4:
			for range 3 {
				randomInput(nil)
			}
		case change == 5:
			park()
		case change == 6:
			unpark()
		case change == 7:
			exec(t, `UPDATE inputs SET quarantine_reason = NULL WHERE session_id = $1`, s)
		default: // nothing
		}

		var turnNow string
		var claimErr error
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, claimErr = tx.Exec(ctx, `SELECT promptline_claim_as_read($1, 'e', 'o', 1, 60000, 'unknown', '', $2)`, s, headIDs)
		if claimErr == nil {
			turnNow = turnOf(t, tx, s)
		}
		require.NoError(t, tx.Rollback(ctx))
		switch {
		case claimErr != nil && strings.Contains(claimErr.Error(), "PLSTA"):
			refused++
		case claimErr != nil:
			require.NoError(t, claimErr)
		case turnNow != read:
			wrong++
			t.Errorf("session %s: the claim passed, but a fresh read chooses %q where the head read chose %q (change %d)", s, turnNow, read, change)
		default:
			passed++
		}
	}
	t.Logf("%d claims passed with the same turn, %d refused, %d passed with another turn", passed, refused, wrong)
	require.Positive(t, passed, "some claims pass: the check is not merely refusing everything")
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}
