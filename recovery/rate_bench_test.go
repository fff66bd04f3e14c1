package recovery_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

var (
	benchClaims     = flag.Int("recovery-bench.claims", 10000, "expired claims of BenchmarkRecoveryRate")
	benchRate       = flag.Float64("recovery-bench.rate", 500, "--recovery-rate of BenchmarkRecoveryRate")
	benchRecoverers = flag.Int("recovery-bench.recoverers", 2, "recoverers (processes' worth) of BenchmarkRecoveryRate")
)

// BenchmarkRecoveryRate is the mass recovery of issue 20: N expired claims
// (ready, a prompt waiting: each decision a paced re-wake), as a fleet-wide
// crash leaves them, recovered by several recoverers on one database at
// --recovery-rate R, with the shipped interval and a batch of R × interval.
// It prints the decisions per second, read back from recoveries.decided_at
// (a ramp: one second's worth at once, then R per second), and the total.
// -recovery-bench.rate 0 measures the unbounded passes, for comparison.
// Out of make test (about N/R seconds):
//
//	go test -run '^$' -bench BenchmarkRecoveryRate -benchtime 1x ./recovery [-recovery-bench.claims 10000 -recovery-bench.rate 500]
func BenchmarkRecoveryRate(b *testing.B) {
	for range b.N {
		benchRecoveryRate(b, *benchClaims, *benchRate, *benchRecoverers)
	}
}

func benchRecoveryRate(b *testing.B, n int, rate float64, recoverers int) {
	b.StopTimer()
	ctx := context.Background()
	pool, _ := testkit.Pool(b)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "dead-process"})
	sessions := make([]string, n)
	for i := range sessions {
		sessions[i] = fmt.Sprintf("s-%05d", i)
	}
	for lo := 0; lo < n; lo += 500 {
		var in []admission.Incoming
		for _, s := range sessions[lo:min(lo+500, n)] {
			in = append(in, admission.Incoming{Prompt: envelope.Prompt{MessageID: "m-" + s, SessionID: s, Text: "hello", Delivery: envelope.DeliveryQueue}})
		}
		_, err := admitter.Admit(ctx, in)
		require.NoError(b, err)
	}
	var wg sync.WaitGroup
	const acquirers = 8
	for w := range acquirers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += acquirers {
				if _, err := claims.AcquireWaiting(ctx, sessions[i], "exec-"+sessions[i], nil); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	_, err := pool.Exec(ctx, `UPDATE claims SET expires_at = now() - interval '1 second'`)
	require.NoError(b, err)
	// The bucket is full, as after a calm.
	_, err = pool.Exec(ctx, `UPDATE recovery_rate SET tokens = $1, updated_at = clock_timestamp()`, max(1, rate))
	require.NoError(b, err)

	interval := 10 * time.Second
	batch := max(100, int(rate*interval.Seconds()))
	if rate == 0 {
		batch = n // unbounded: what the passes reach, for comparison
	}
	b.StartTimer()
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	recs := make([]*recovery.Recoverer, recoverers)
	for i := range recs {
		recs[i] = recovery.New(pool, &recovery.Config{OwnerID: fmt.Sprintf("recoverer-%d", i), Interval: interval, Batch: batch,
			RedriveAfter: time.Hour, Rate: rate})
		require.NoError(b, recs[i].Start(runCtx))
	}
	deadline := start.Add(time.Duration(float64(n)/max(rate, 10)*float64(time.Second)) + time.Minute)
	for testkit.Count(b, pool, `SELECT count(*) FROM recoveries`) < n {
		require.True(b, time.Now().Before(deadline), "the recovery did not finish")
		time.Sleep(50 * time.Millisecond) // polling the progress of a measurement, not synchronising an assertion
	}
	total := time.Since(start)
	b.StopTimer()
	for _, r := range recs {
		r.Stop()
	}

	rows, err := pool.Query(ctx, `SELECT floor(extract(epoch FROM decided_at - $1::timestamptz))::int AS s, count(*)::int
		FROM recoveries GROUP BY 1 ORDER BY 1`, start)
	require.NoError(b, err)
	type second struct{ S, N int }
	per, err := pgx.CollectRows(rows, pgx.RowToStructByPos[second])
	require.NoError(b, err)
	out := os.Stdout
	fmt.Fprintf(out, "recovery at --recovery-rate %g: %d expired claims, %d recoverers, batch %d, interval %s\n", rate, n, recoverers, batch, interval)
	fmt.Fprintf(out, "  second  decisions\n")
	for _, p := range per {
		fmt.Fprintf(out, "  %6d  %9d\n", p.S, p.N)
	}
	achieved := float64(n) / total.Seconds()
	fmt.Fprintf(out, "  total %s: %.0f decisions/s", total.Round(10*time.Millisecond), achieved)
	if rate > 0 {
		fmt.Fprintf(out, " (the bound: one second's worth at once, then %g/s: %.1fs)", rate, max(0, float64(n)-max(1, rate))/rate)
	}
	fmt.Fprintln(out)
	b.ReportMetric(achieved, "decisions/s")
	require.Equal(b, n, testkit.Count(b, pool, `SELECT count(*) FROM recoveries WHERE decision = 'rewoken'`), "each claim once")
}
