package ledger

import (
	"cmp"
	"context"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/groupflush"
)

// groupCommit sends the queued transactions of several sessions as one
// transaction: one round trip and one commit for all of them. Measured on
// the end-to-end bench (docs/benchmarks.md): 1.9x the completed turns at
// 1,000 prompts/s, and p99 at 250/s from over a second to about 100 ms, on
// 2 cores, where per-transaction costs (round trip, commit, wake-ups)
// dominate.
//
// A session's statements still commit all together or not at all, and it
// never sees another session's failure: when the server refuses a combined
// transaction (one session fenced, a key violated, a deadlock), it has
// rolled back entirely, and each session's statements are sent again alone,
// so only the session at fault fails. Result callbacks may therefore run
// twice, and must be idempotent. A combined transaction whose outcome is
// unknown (the connection was lost before its answer: it may have
// committed) is never sent again: every sender gets the error, as it would
// alone.
//
// There is no background goroutine to stop (groupflush.Queue): a sender
// that finds fewer than maxInFlight flushes running starts one, which
// drains the queue and ends.
// Sessions are sorted within a transaction, as admission sorts them, so two
// transactions that lock several session rows never deadlock each other.
type groupCommit struct {
	pool  *pgxpool.Pool
	queue groupflush.Queue[*queuedTx]

	// For tests: transactions of several sessions, and those of them that
	// failed and were sent again one by one.
	combined, separated atomic.Int64
}

type queuedTx struct {
	session string
	batch   *pgx.Batch
	done    chan error
}

// Bounds of group commit. Four flushes in flight measured best on 2 cores
// (2: 725, 4: 917 and 841, 8: 808 completed turns/s at 1,000/s offered).
const (
	maxInFlight      = 4
	maxSessionsPerTx = 64
)

func newGroupCommit(pool *pgxpool.Pool) *groupCommit {
	g := &groupCommit{pool: pool}
	g.queue = groupflush.Queue[*queuedTx]{
		Max:   maxInFlight,
		Take:  func(queued []*queuedTx) int { return min(len(queued), maxSessionsPerTx) },
		Flush: g.flush,
	}
	return g
}

// send runs b as one transaction, with the queued transactions of other
// sessions when there are any, and returns its error. It waits for the
// outcome even when ctx ends: once queued, the statements may commit, and
// the caller must know (statement timeouts bound the wait).
func (g *groupCommit) send(session string, b *pgx.Batch) error {
	q := &queuedTx{session: session, batch: b, done: make(chan error, 1)}
	g.queue.Add(q)
	return <-q.done
}

func (g *groupCommit) flush(txs []*queuedTx) {
	ctx := context.Background() // the senders wait for the outcome whatever their contexts
	if len(txs) == 1 {
		txs[0].done <- g.pool.SendBatch(ctx, txs[0].batch).Close()
		return
	}
	slices.SortStableFunc(txs, func(a, b *queuedTx) int { return cmp.Compare(a.session, b.session) })
	all := &pgx.Batch{}
	for _, t := range txs {
		all.QueuedQueries = append(all.QueuedQueries, t.batch.QueuedQueries...)
	}
	g.combined.Add(1)
	err := g.pool.SendBatch(ctx, all).Close()
	if err == nil || !rolledBack(err) {
		// Committed, or perhaps committed (the connection was lost with
		// the answer): sent again alone, a transaction that did commit
		// would be applied twice. Each sender gets the error and decides
		// (ledger.RetryOpts.Landed).
		for _, t := range txs {
			t.done <- err
		}
		return
	}
	// Everything rolled back: each alone, so that only the one at fault
	// fails. A batch is sent once, so the queries are copied.
	g.separated.Add(1)
	for _, t := range txs {
		alone := &pgx.Batch{}
		for _, q := range t.batch.QueuedQueries {
			alone.QueuedQueries = append(alone.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn})
		}
		t.done <- g.pool.SendBatch(ctx, alone).Close()
	}
}
