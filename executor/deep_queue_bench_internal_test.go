package executor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// BenchmarkTurnAtQueueDepth measures what a turn sends to the database,
// less the provider, at a session whose queue holds depth prompts: the
// read without a claim and the claim with the first turn (Peek and
// claimFirstTurn, as acquire), the read and the promotion of the next turn
// under the claim (readView and promoteQueued, as promote), then the
// stopping release (Release). Each iteration takes two prompts of the
// queue; the queue is filled afresh, by plain SQL, before each run. Shallow
// is the baseline of the same run:
//
//	go test -run '^$' -bench TurnAtQueueDepth -benchtime 20x ./executor/
func BenchmarkTurnAtQueueDepth(b *testing.B) {
	ctx := context.Background()
	pool, _ := testkit.Pool(b)
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "bench"})
	e, err := NewExecutor(pool, &ExecutorConfig{Claims: claims})
	if err != nil {
		b.Fatal(err)
	}
	run := 0
	for _, depth := range []int{10, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("Depth%d", depth), func(b *testing.B) {
			run++
			s := fmt.Sprintf("deep-%d-%d", depth, run)
			fill := depth + 2*b.N
			for _, q := range []struct {
				sql  string
				args []any
			}{
				{`INSERT INTO sessions (session_id) VALUES ($1)`, []any{s}},
				{`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
				 SELECT $1 || '-' || lpad(g::text, 7, '0'), $1, 'prompt ' || g, '\x00', 'queue', true
				 FROM generate_series(1, $2::int) g`, []any{s, fill}},
				{`ANALYZE inputs`, nil},
			} {
				if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
					b.Fatal(q.sql, err)
				}
			}
			b.ResetTimer()
			for range b.N {
				view := &sessionView{}
				read, err := claims.Peek(ctx, s, func(bt *pgx.Batch) { view.queue(bt, s) })
				if err != nil {
					b.Fatal(err)
				}
				ex := &execution{e: e, sessionID: s}
				if _, err := ex.claimFirstTurn(ctx, read, view); err != nil {
					b.Fatal("claim with the first turn: ", err)
				}
				v, err := ex.readView(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ex.promoteQueued(ctx, v); err != nil {
					b.Fatal("next turn: ", err)
				}
				if _, err := ex.x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: wakeRow(e.cfg.Topics.Wakes, s, "bench", time.Now().UTC())}); err != nil {
					b.Fatal("release: ", err)
				}
			}
		})
	}
}
