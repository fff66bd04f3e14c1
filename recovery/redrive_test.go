package recovery_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// The redrive scan filters before it limits: sessions that cannot be
// redriven (a quarantined or a live claim, a recent redrive) are never
// counted against the batch. Before the fix the scan took the batch's
// oldest sessions with waiting inputs and only then dropped the blocked
// ones, so more blocked sessions than the batch, with older inputs,
// starved every lost wake behind them for good.
func TestRedriveFindsALostWakeBehindBlockedSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const batch = 3
	b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: batch, RedriveAfter: time.Minute})
	blocked := 0
	block := func(kind string, n int, claim string) {
		for i := range n {
			s := fmt.Sprintf("%s-%d", kind, i)
			b.admit(t, s, "m-"+s, "older")
			switch claim {
			case "quarantined":
				b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason, quarantined_at)
					VALUES ($1, $1 || '-exec', 'dead', 1, 'bogus', now() - interval '1 hour', 'unknown phase "bogus"', now())`, s)
			case "live":
				b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
					VALUES ($1, $1 || '-exec', 'busy', 1, 'unknown', now() + interval '1 hour')`, s)
			case "redriven":
				b.exec(t, `UPDATE sessions SET redriven_at = now() WHERE session_id = $1`, s)
			}
			blocked++
		}
	}
	block("quarantined", batch+1, "quarantined") // waiting for an operator
	block("live", batch+1, "live")               // a long-running turn
	block("redriven", batch+1, "redriven")       // woken a moment ago
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour'`)
	b.admit(t, "lost", "m-lost", "newer")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '10 minutes' WHERE message_id = 'm-lost'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`) // every wake was lost
	require.Greater(t, blocked, batch)

	p := b.pass(t)
	require.Equal(t, 1, p.Redriven, "the lost wake behind %d blocked sessions is found", blocked)
	require.Equal(t, 1, b.wakes(t, "lost"))
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key <> 'lost'`), "no blocked session is woken")
	require.Zero(t, b.pass(t).Redriven, "at most once per redrive interval")
	rec := &recorder{}
	b.run(t, rec, nil, "lost")
	require.Len(t, rec.all(), 1, "the prompt whose wake was lost ran")
}

// A pass that re-wakes n sessions tells OnRedriveFunc n and OnCommitFunc
// once (the relay publishes the wakes at once); a pass that wrote nothing
// tells neither.
func TestRedriveCallbacks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var redriven []int
	commits := 0
	b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute,
		OnRedriveFunc: func(n int) { redriven = append(redriven, n) },
		OnCommitFunc:  func() { commits++ },
	})
	require.Zero(t, b.pass(t).Redriven)
	require.Empty(t, redriven, "nothing re-woken, nothing told")
	require.Zero(t, commits, "nothing written, no commit told")

	b.admit(t, "lost", "m-lost", "hello")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '10 minutes'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
	require.Equal(t, 1, b.pass(t).Redriven)
	require.Equal(t, []int{1}, redriven)
	require.Equal(t, 1, commits)
}
