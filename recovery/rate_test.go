package recovery_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/recovery"
)

// expiredReady leaves n sessions r-000.. each with a ready claim and a
// waiting prompt, expired as a fleet-wide crash leaves them: each decision
// is rewoken, and wakes its session (paced).
func (b *testBundle) expiredReady(t *testing.T, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	in := make([]admission.Incoming, n)
	sessions := make([]string, n)
	for i := range n {
		sessions[i] = fmt.Sprintf("%s-%03d", prefix, i)
		in[i] = admission.Incoming{Prompt: envelope.Prompt{MessageID: "m-" + sessions[i], SessionID: sessions[i],
			Text: "hello", Delivery: envelope.DeliveryQueue}}
	}
	_, err := b.admitter.Admit(ctx, in)
	require.NoError(t, err)
	for _, s := range sessions {
		b.acquire(t, s, "exec-"+s)
	}
	b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id LIKE $1 || '-%'`, prefix)
	return sessions
}

// fillBucket sets the fleet's bucket to tokens, now.
func (b *testBundle) fillBucket(t *testing.T, tokens float64) {
	t.Helper()
	b.exec(t, `UPDATE recovery_rate SET tokens = $1, updated_at = clock_timestamp()`, tokens)
}

// decidedAt are the decision times of the recoveries, in order.
func (b *testBundle) decidedAt(t *testing.T) []time.Time {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT decided_at FROM recoveries ORDER BY decided_at`)
	require.NoError(t, err)
	at, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	return at
}

// With --recovery-rate R, two recoverers on one database (two processes'
// worth) together never decide more than the bucket holds: in any window
// [t_i, t_j] of the recorded decisions (recoveries.decided_at is the time
// each took its token), at most burst + R·(t_j - t_i) of them. A bucket per
// process would let the two send twice the rate. Every claim is still
// decided exactly once.
func TestRecoveryRateBoundsTheFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const (
		rate  = 20.0
		burst = 20.0 // one second's worth
		n     = 70
	)
	b.expiredReady(t, "r", n)
	b.fillBucket(t, burst)

	var wg sync.WaitGroup
	passes := make([]recovery.Pass, 2)
	for i := range passes {
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: fmt.Sprintf("rec-%d", i), Batch: 100, RedriveAfter: time.Hour,
			Rate: rate, Interval: time.Minute})
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := rec.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			passes[i] = p
		}()
	}
	wg.Wait()
	t.Logf("decisions: %v and %v", passes[0].Decisions, passes[1].Decisions)
	require.Equal(t, n, passes[0].Decisions[recovery.DecisionRewoken]+passes[1].Decisions[recovery.DecisionRewoken], "every claim is decided")
	require.Zero(t, passes[0].Deferred+passes[1].Deferred, "nothing deferred within the pass's budget")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	// Once each: the passes' decisions above (recoveries' key is the
	// execution, so a second decision would have failed its insert, not
	// added a row).
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM recoveries WHERE decision = 'rewoken'`), "a record of each")

	at := b.decidedAt(t)
	require.Len(t, at, n)
	for i := range at {
		for j := i; j < len(at); j++ {
			allowed := burst + rate*at[j].Sub(at[i]).Seconds() + 1e-6
			require.LessOrEqual(t, float64(j-i+1), allowed, "%d decisions between %s and %s: more than the bucket holds",
				j-i+1, at[i].Format(time.StampMicro), at[j].Format(time.StampMicro))
		}
	}
	// Not vacuous: the pace was reached (the run lasted at least as long
	// as the tokens beyond the burst take to refill), and not far below.
	span := at[n-1].Sub(at[0])
	require.GreaterOrEqual(t, span, time.Duration((n-burst)/rate*float64(time.Second))-time.Millisecond)
	require.Less(t, span, time.Duration((n-burst)/rate*float64(time.Second))+2*time.Second, "the pass keeps to the rate, not far below it")
}

// A pass that runs out of tokens within its interval leaves the rest as
// they were, expired claims and lost wakes alike, counted as deferred;
// later passes decide them, each once: nothing is lost or skipped for good.
func TestRecoveryRateDefersTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Claims", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.expiredReady(t, "d", 4)
		b.fillBucket(t, 1)
		deferred := map[string]int{}
		var mu sync.Mutex
		// One token in ten seconds: no pass, however loaded the machine,
		// lasts long enough for a second token to refill.
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Rate: 0.1, Interval: 100 * time.Millisecond,
			OnDeferredFunc: func(kind string, n int) { mu.Lock(); deferred[kind] += n; mu.Unlock() }})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken], "one token: one decision")
		require.Equal(t, 3, p.Deferred)
		require.Equal(t, map[string]int{"claim": 3}, deferred)
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NULL AND expires_at <= now()`), "left as they were")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries`))

		// At two tokens a second, later passes decide the rest.
		rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Rate: 2, Interval: 100 * time.Millisecond})
		require.Eventually(t, func() bool {
			_, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			return b.count(t, `SELECT count(*) FROM recoveries`) == 4
		}, 20*time.Second, time.Millisecond, "later passes decide the rest")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, 4, b.count(t, `SELECT count(*) FROM recoveries WHERE decision = 'rewoken'`))
	})

	t.Run("LostWakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, s := range []string{"w1", "w2", "w3"} {
			b.admit(t, s, "m-"+s, "hello") // admitted, its wake lost
		}
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 minute'`)
		b.fillBucket(t, 1)
		deferred := map[string]int{}
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: 30 * time.Second, Rate: 0.1, Interval: 100 * time.Millisecond,
			OnDeferredFunc: func(kind string, n int) { deferred[kind] += n }})
		wakesBefore := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`)
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, p.Redriven)
		require.Equal(t, 2, p.Deferred)
		require.Equal(t, map[string]int{"wake": 2}, deferred)
		require.Equal(t, wakesBefore+1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL`))

		rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: 30 * time.Second, Rate: 2, Interval: 100 * time.Millisecond})
		require.Eventually(t, func() bool {
			_, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			return b.count(t, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL`) == 3
		}, 20*time.Second, time.Millisecond, "later passes re-wake the rest")
		require.Equal(t, wakesBefore+3, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`), "each once")
	})

	// A token that comes within the pass's interval is waited for: the
	// pass goes on re-waking after the wait, and defers nothing.
	t.Run("LostWakesWaitedForWithinThePass", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, s := range []string{"w1", "w2", "w3"} {
			b.admit(t, s, "m-"+s, "hello")
		}
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 minute'`)
		b.fillBucket(t, 1)
		// One token now, then one every 100 ms, within a pass of a minute.
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: 30 * time.Second, Rate: 10, Interval: time.Minute})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, p.Redriven)
		require.Zero(t, p.Deferred)
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL`))
	})

	// The batch bounds a pass's re-wakes however many tokens come while it
	// waits: a scan after a wait looks for what the batch has left, not
	// more. A trigger dates every take ten seconds back, so the take after
	// the wait finds the bucket full (ten tokens), as after a long wait on
	// a loaded machine.
	t.Run("LostWakesBoundedByTheBatchAfterAWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, s := range []string{"w1", "w2", "w3", "w4", "w5"} {
			b.admit(t, s, "m-"+s, "hello")
		}
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 minute'`)
		// One token, dated ahead, so that the first take finds exactly one
		// however long the test takes to get there, and the pass waits.
		b.exec(t, `UPDATE recovery_rate SET tokens = 1, updated_at = clock_timestamp() + interval '1 minute'`)
		b.exec(t, `CREATE FUNCTION calm() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN NEW.updated_at := NEW.updated_at - interval '10 seconds'; RETURN NEW; END $$`)
		b.exec(t, `CREATE TRIGGER calm BEFORE UPDATE ON recovery_rate FOR EACH ROW EXECUTE FUNCTION calm()`)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: 30 * time.Second, Rate: 10, Batch: 2, Interval: time.Minute})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, p.Redriven, "one before the wait, one after: the batch")
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL`))
	})
}

// A decision whose transaction fails after it took its token gives the
// token back with its rollback (the token is taken in the decision's own
// transaction), transient failure or deterministic: with one token in the
// bucket and no refill to speak of, the failed decision of session a
// leaves it for the next claim, b, which is decided in the same pass.
func TestRecoveryRateTokenReturnedOnFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		errcode string
		check   func(t *testing.T, b *testBundle, p recovery.Pass)
	}{
		{"Transient", "40001", func(t *testing.T, b *testBundle, p recovery.Pass) {
			require.Equal(t, 1, p.Retried, "a is left for the next pass")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'a' AND quarantine_reason IS NULL`))
		}},
		{"Deterministic", "P0001", func(t *testing.T, b *testBundle, p recovery.Pass) {
			require.Equal(t, 1, p.Decisions[recovery.DecisionQuarantined], "a is quarantined (decision failed)")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'a' AND quarantine_reason LIKE 'decision failed:%'`))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, s := range []string{"a", "b"} {
				b.admit(t, s, "m-"+s, "hello")
				b.acquire(t, s, "exec-"+s)
			}
			// a first in the scan.
			b.exec(t, `UPDATE claims SET expires_at = now() - CASE session_id WHEN 'a' THEN interval '2 seconds' ELSE interval '1 second' END`)
			// The failure: the decision's record, after its token was taken.
			b.exec(t, fmt.Sprintf(`CREATE FUNCTION fail_a() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN IF NEW.session_id = 'a' AND NEW.decision <> 'quarantined' THEN
					RAISE EXCEPTION 'injected failure' USING ERRCODE = '%s'; END IF; RETURN NEW; END $$`, tc.errcode))
			b.exec(t, `CREATE TRIGGER fail_a BEFORE INSERT ON recoveries FOR EACH ROW EXECUTE FUNCTION fail_a()`)
			b.fillBucket(t, 1)
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Rate: 0.001, Interval: 100 * time.Millisecond})
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			tc.check(t, b, p)
			require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken], "b got the token a's rollback returned")
			require.Zero(t, p.Deferred)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'b'`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_rate WHERE tokens < 1`), "the one token is spent, once")
		})
	}
}

// Rate 0 (the default) is unbounded, today's behaviour: one pass decides
// every claim of its batch, and the bucket is not even read.
func TestRecoveryRateZeroIsUnbounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.expiredReady(t, "u", 50)
	b.fillBucket(t, 0)
	var before time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT updated_at FROM recovery_rate`).Scan(&before))
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Interval: 100 * time.Millisecond})
	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 50, p.Decisions[recovery.DecisionRewoken])
	require.Zero(t, p.Deferred)
	var after time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT updated_at FROM recovery_rate`).Scan(&after))
	require.Equal(t, before, after, "the bucket was not touched")
}

// A pass never waits for the bucket while it holds row locks: with the
// bucket's row held by a paused transaction (a zombie between its take and
// its commit), a pass still ends within its interval, decides what costs
// nothing (a reconcile with nothing waiting) and defers the paced claim,
// holding none of its locks; once the zombie's transaction ends, the next
// pass decides it.
func TestRecoveryRateNeverWaitsForTheBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "free", "m-free", "hello")
	c := b.startTurn(t, "free", "m-free")
	b.beginAttempt(t, c, 1, "scripted") // phase unknown, nothing waiting: reconciled, free
	b.die(t, "free")
	b.expiredReady(t, "paced", 1)
	b.fillBucket(t, 1)

	zombie, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = zombie.Exec(ctx, `UPDATE recovery_rate SET tokens = 0, updated_at = clock_timestamp()`) // its take, uncommitted
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, zombie.Rollback(ctx)) })
	t.Cleanup(rollback)

	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Rate: 10, Interval: 300 * time.Millisecond})
	done := make(chan recovery.Pass, 1)
	go func() {
		p, err := rec.RunOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	var p recovery.Pass
	select {
	case p = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pass waited for the bucket's row")
	}
	require.Equal(t, 1, p.Decisions[recovery.DecisionReconciled], "what costs nothing is decided")
	require.Equal(t, 1, p.Deferred, "the paced claim is deferred")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'paced-000' AND quarantine_reason IS NULL`))

	rollback()
	p, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken])
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}

// An extreme --recovery-rate is a rate, not an error: a rate too large for
// the bucket's arithmetic (float8 overflow in Postgres) must not make every
// paced decision fail and quarantine its claim, and one too small for a
// time.Duration must not turn the wait for the next token negative (a
// pass spinning on the database for its whole interval).
func TestRecoveryRateExtremeRates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.expiredReady(t, "huge", 3)
	b.exec(t, `UPDATE recovery_rate SET tokens = 0, updated_at = clock_timestamp() - interval '5 seconds'`)
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "rec", Batch: 10, RedriveAfter: time.Hour,
		Rate: 1e308, Interval: time.Second})
	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Failed, "no decision failed on the bucket's arithmetic")
	require.Zero(t, p.Decisions[recovery.DecisionQuarantined], "no claim quarantined for a large rate")
	require.Equal(t, 3, p.Decisions[recovery.DecisionRewoken]+p.Decisions[recovery.DecisionContinued], "every claim decided")

	b.expiredReady(t, "tiny", 1)
	b.fillBucket(t, 0)
	var tries int
	rec = recovery.New(b.pool, &recovery.Config{OwnerID: "rec2", Batch: 10, RedriveAfter: time.Hour,
		Rate: 1e-12, Interval: 300 * time.Millisecond,
		OnDeferredFunc: func(string, int) { tries++ }})
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, err = rec.RunOnce(tctx)
	require.NoError(t, err, "the pass ends (it does not spin on a negative wait)")
	require.Equal(t, 1, p.Deferred, "the claim is left for a later pass")
	require.Equal(t, 1, tries)
	var attempts int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM recoveries WHERE session_id LIKE 'tiny-%'`).Scan(&attempts))
	require.Zero(t, attempts)
}
