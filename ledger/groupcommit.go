package ledger

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
// A result callback that fails (its own error, or a Scan that fails) is its
// session's alone: the server knows nothing of it and commits, so every
// callback still runs (ownResults) and each sender gets its own callback's
// error, as it would alone; the others are told that they committed. The
// sender at fault committed too: its error is neither a refusal nor
// transient, so its caller treats the write as one that may have landed
// (the claim left to expire, recovery deciding from what committed).
//
// There is no background goroutine to stop (groupflush.Queue): a sender
// that finds fewer than maxInFlight flushes running starts one, which
// drains the queue and ends.
// Sessions are sorted within a transaction in byte order (Go's string
// order), as admission's lockSessionsSQL locks them (COLLATE "C", whatever
// the database's collation), so two transactions that lock several session
// rows never deadlock each other.
type groupCommit struct {
	pool  *pgxpool.Pool
	queue groupflush.Queue[*queuedTx]
	// timeout bounds each transaction a flush sends
	// (ClaimsConfig.RoundTripTimeout): the senders wait whatever their
	// contexts, so without it a connection gone silent (a partition, a
	// failover with no reset) would hold its flush, and every sender in
	// it, until the kernel gave up. Past it pgx closes the connection and
	// the error is a lost connection's: the combined transaction is in
	// doubt and never sent again.
	timeout time.Duration

	// For tests: transactions of several sessions, those of them that
	// failed and were sent again one by one, and the calls whose writes
	// went grouped (grouped_calls.go).
	combined, separated, grouped atomic.Int64
}

type queuedTx struct {
	session string
	batch   *pgx.Batch
	done    chan error
	// call, when not nil, is batch's one statement as a call of a
	// groupedFunc, whose writes a flush may send grouped with others of
	// its function (grouped_calls.go).
	call *groupedCall
}

// Bounds of group commit. Four flushes in flight measured best on 2 cores
// (2: 725, 4: 917 and 841, 8: 808 completed turns/s at 1,000/s offered).
const (
	maxInFlight      = 4
	maxSessionsPerTx = 64
)

func newGroupCommit(pool *pgxpool.Pool, timeout time.Duration) *groupCommit {
	g := &groupCommit{pool: pool, timeout: timeout}
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
// the caller must know (g.timeout bounds the wait).
func (g *groupCommit) send(session string, b *pgx.Batch) error {
	return g.sendCall(session, b, nil)
}

// sendCall is send for a batch whose one statement is call, which a flush
// may send grouped with other calls of its function when its arguments
// allow (grouped_calls.go); nil is send.
func (g *groupCommit) sendCall(session string, b *pgx.Batch, call *groupedCall) error {
	q := &queuedTx{session: session, batch: b, done: make(chan error, 1), call: call}
	g.queue.Add(q)
	return <-q.done
}

// sendBatch sends b as one transaction, bounded by g.timeout, not by any
// sender's context: the senders wait for the outcome whatever their
// contexts.
func (g *groupCommit) sendBatch(b *pgx.Batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	return g.pool.SendBatch(ctx, b).Close()
}

func (g *groupCommit) flush(txs []*queuedTx) {
	if len(txs) == 1 {
		txs[0].done <- g.sendBatch(txs[0].batch)
		return
	}
	slices.SortStableFunc(txs, func(a, b *queuedTx) int { return cmp.Compare(a.session, b.session) })
	// Calls of a groupedFunc, when the flush holds two or more of one:
	// each sends its opening in its place, and their writes go in one
	// statement at the end (grouped_calls.go).
	groups := make([][]*queuedTx, len(groupedFuncs))
	grouped := make([]int, len(txs)) // txs[i]'s groupedFuncs index, or -1
	for i, t := range txs {
		grouped[i] = t.groupIndex()
		if grouped[i] >= 0 {
			groups[grouped[i]] = append(groups[grouped[i]], t)
		}
	}
	all := &pgx.Batch{}
	failed := make([]error, len(txs)) // each sender's first callback error
	for i, t := range txs {
		if f := grouped[i]; f >= 0 && len(groups[f]) >= 2 {
			q := t.batch.QueuedQueries[0]
			all.QueuedQueries = append(all.QueuedQueries, &pgx.QueuedQuery{SQL: groupedFuncs[f].openSQL,
				Arguments: t.call.args[:groupedFuncs[f].open], Fn: ownResults(q.Fn, &failed[i])})
			continue
		}
		for _, q := range t.batch.QueuedQueries {
			// A copy: t.batch keeps its own callbacks, for a split.
			all.QueuedQueries = append(all.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: ownResults(q.Fn, &failed[i])})
		}
	}
	for f, group := range groups {
		if len(group) >= 2 {
			all.QueuedQueries = append(all.QueuedQueries, groupedFuncs[f].writes(group))
			g.grouped.Add(int64(len(group)))
		}
	}
	g.combined.Add(1)
	err := g.sendBatch(all)
	switch {
	case err == nil:
		// Committed: each sender's statements are there, and its own
		// callbacks' error, if any, is its alone.
		for i, t := range txs {
			t.done <- failed[i]
		}
		return
	case !rolledBack(err):
		// Perhaps committed (the connection was lost with the answer), or
		// still running on the server (waiting on a lock in one session's
		// part): sent again alone, a transaction that did commit would be
		// applied twice. Each sender gets the error and decides
		// (ledger.RetryOpts.Landed); its retry keeps its write's position,
		// so the fence lets the write apply once, whichever comes first
		// (crash window "stale-write").
		for _, t := range txs {
			t.done <- err
		}
		return
	}
	// Everything rolled back: each alone, so that only the one at fault
	// fails. A batch is sent once, so the queries are copied.
	g.separated.Add(1)
	for _, t := range txs {
		t.done <- g.sendBatch(copyBatch(t.batch))
	}
}

// copyBatch is b's queries, to be sent again: pgx sends a batch once (a
// query sent keeps the description of the statement it prepared, on the
// connection that sent it).
func copyBatch(b *pgx.Batch) *pgx.Batch {
	again := &pgx.Batch{}
	for _, q := range b.QueuedQueries {
		again.QueuedQueries = append(again.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn})
	}
	return again
}

// ownResults is the result callback fn in a combined transaction. fn's own
// error (the callback's, a Scan's) is stored in *failed, the first one
// only, and kept from pgx: pgx stops calling callbacks after one fails, and
// carries a failed Scan on to the next statement, so the later sessions'
// callbacks would not run, and the batch's error would be a callback's
// where the server committed. What it returns is the statement's own
// error, the server's or the connection's, which is the transaction's.
func ownResults(fn func(pgx.BatchResults) error, failed *error) func(pgx.BatchResults) error {
	if fn == nil {
		return nil // pgx reads the result itself
	}
	return func(br pgx.BatchResults) error {
		r := &ownBatchResults{BatchResults: br}
		if err := fn(r); err != nil && *failed == nil {
			*failed = err
		}
		return r.end()
	}
}

// ownBatchResults is the one statement's result a callback reads, whose
// rows keep the callback's errors to themselves.
type ownBatchResults struct {
	pgx.BatchResults
	read bool
	rows *ownRows // read by Query or QueryRow
	err  error    // Exec's
}

func (r *ownBatchResults) Exec() (pgconn.CommandTag, error) {
	r.read = true
	var ct pgconn.CommandTag
	ct, r.err = r.BatchResults.Exec()
	return ct, r.err
}

func (r *ownBatchResults) Query() (pgx.Rows, error) {
	r.read = true
	rows, err := r.BatchResults.Query()
	r.rows = &ownRows{Rows: rows}
	return r.rows, err
}

func (r *ownBatchResults) QueryRow() pgx.Row {
	_, _ = r.Query() // an error is the rows', as in pgx
	return ownRow{r.rows}
}

// end reads the rest of the statement's result and returns its error: the
// server's or the connection's, never the callback's.
func (r *ownBatchResults) end() error {
	switch {
	case r.rows != nil:
		r.rows.Rows.Close()
		return r.rows.Rows.Err()
	case !r.read: // a callback that read nothing: its result is still read
		_, err := r.BatchResults.Exec()
		return err
	}
	return r.err
}

// ownRows are a statement's rows whose Scan errors are the callback's:
// pgx's rows record a failed Scan as their own error, which the batch then
// reports at the next statement. Values is pgx's: it fails only when the
// driver cannot decode what the server sent in the column's own type.
type ownRows struct {
	pgx.Rows
	err error // a Scan's
}

func (r *ownRows) Next() bool { return r.err == nil && r.Rows.Next() }

func (r *ownRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Rows.Err()
}

func (r *ownRows) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	var err error
	if rs, ok := onlyRowScanner(dest); ok {
		err = rs.ScanRow(r)
	} else {
		err = pgx.ScanRow(r.TypeMap(), r.FieldDescriptions(), r.RawValues(), dest...)
	}
	if err != nil {
		// As pgx's: the rows end with the error, the rest of the result
		// is read.
		if r.err == nil {
			r.err = err
		}
		r.Rows.Close()
	}
	return err
}

func onlyRowScanner(dest []any) (pgx.RowScanner, bool) {
	if len(dest) != 1 {
		return nil, false
	}
	rs, ok := dest[0].(pgx.RowScanner)
	return rs, ok
}

// ownRow is pgx's QueryRow over ownRows.
type ownRow struct{ rows *ownRows }

func (r ownRow) Scan(dest ...any) error {
	if err := r.rows.Err(); err != nil {
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			r.rows.Close()
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return errNoRow
	}
	_ = r.rows.Scan(dest...) // its error is the rows'
	r.rows.Close()
	return r.rows.Err()
}
