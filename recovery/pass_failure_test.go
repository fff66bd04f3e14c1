package recovery_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// A pass whose decision fails deterministically quarantines the claim, and
// what becomes of that quarantine is counted apart: quarantined (failed),
// the claim changed meanwhile (skipped), a transient error (retried, the
// claim left for the next pass), any other error (logged); in every case
// the pass goes on to the next claim. The decision of r1 fails because its
// execution has a decision recorded already (record refuses it); a trigger
// on claims stands for what happens to the quarantine's own UPDATE.
func TestRecoveryPassAfterAFailedDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		trigger                  string // the body of a BEFORE UPDATE trigger on the quarantine, or none
		failed, skipped, retried int
		quarantined              bool
	}{
		"Quarantined":        {failed: 1, quarantined: true},
		"ClaimChanged":       {trigger: `RETURN NULL;`, skipped: 1},
		"TransientError":     {trigger: `RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001';`, retried: 1},
		"DeterministicError": {trigger: `RAISE EXCEPTION 'refused';`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for i, s := range []string{"r1", "r2"} {
				b.admit(t, s, s+"m", "hello")
				b.acquire(t, s, "exec-"+s)
				b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
			}
			b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by)
				VALUES ('exec-r1', 'r1', 'ready', 'rewoken', '{}', 1, 2, 'earlier')`)
			if tc.trigger != "" {
				b.exec(t, `CREATE FUNCTION quarantine_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+tc.trigger+` END $$`)
				b.exec(t, `CREATE TRIGGER quarantine_fault BEFORE UPDATE ON claims FOR EACH ROW
					WHEN (OLD.quarantine_reason IS NULL AND NEW.quarantine_reason IS NOT NULL) EXECUTE FUNCTION quarantine_fault()`)
			}
			seen := &decisions{}
			var transient atomic.Int32
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, OnDecisionFunc: seen.add,
				OnTransientErrorFunc: func() { transient.Add(1) }})

			p, err := rec.RunOnce(ctx)
			require.NoError(t, err, "a failed decision does not fail the pass")
			require.Equal(t, tc.failed, p.Failed)
			require.Equal(t, tc.skipped, p.Skipped)
			require.Equal(t, tc.retried, p.Retried)
			require.Equal(t, tc.retried, int(transient.Load()))
			want := map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}
			wantSeen := []recovery.DecisionKind{recovery.DecisionRewoken}
			if tc.quarantined {
				want[recovery.DecisionQuarantined] = 1
				wantSeen = []recovery.DecisionKind{recovery.DecisionQuarantined, recovery.DecisionRewoken}
			}
			require.Equal(t, want, p.Decisions, "r2 is decided after r1's failure")
			require.Equal(t, wantSeen, seen.get())
			q := 0
			if tc.quarantined {
				q = 1
			}
			require.Equal(t, q, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND quarantine_reason LIKE 'decision failed: %'`))
			var decided []string
			for _, e := range testkit.SessionEvents(t, b.pool, "r1", envelope.EventRecoveryDecided) {
				decided = append(decided, e.Decision)
			}
			if tc.quarantined {
				require.Equal(t, []string{string(recovery.DecisionQuarantined)}, decided, "the quarantine is announced with it")
			} else {
				require.Empty(t, decided, "nothing committed, nothing announced")
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1'`), "the claim stays")
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r2'`))
		})
	}
}

// A claim renewed by its holder after the pass listed it as expired (a
// paused process that woke in time) is not taken over: the pass counts it
// skipped, writes nothing for it, and decides the next claim. The renewal
// lands while the pass waits for the session's lock.
func TestRecoveryPassSkipsAClaimRenewedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i, s := range []string{"r1", "r2"} {
		b.admit(t, s, s+"m", "hello")
		b.acquire(t, s, "exec-"+s)
		b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
	}
	release := b.holdSession(t, "r1")
	done := make(chan recovery.Pass, 1)
	go func() {
		p, err := b.rec.RunOnce(ctx)
		assert.NoError(t, err)
		done <- p
	}()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`) == 1
	}, 10*time.Second, 5*time.Millisecond, "the pass waits for r1's session row")
	b.exec(t, `UPDATE claims SET expires_at = now() + interval '1 minute' WHERE session_id = 'r1'`)
	release()
	p := <-done
	require.Equal(t, 1, p.Skipped)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions, "r2 is decided after r1's skip")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND execution_id = 'exec-r1'`), "r1's holder keeps it")
	require.Empty(t, b.records(t, "r1"))
}
