package pgdb

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/faults"
)

// commitTracer finds every commit of a write that the process sends, for
// the crash sweep (docs/testing.md): pgx calls it around each statement
// and batch on every connection of a pool that Open made, so no write path
// can bypass it (TestEveryPoolIsOpenedByPgdb keeps pools in Open). It is
// installed only in builds with the faults tag.
//
// A commit of a write is: COMMIT of a transaction that ran a writing
// statement; a writing statement sent outside a transaction (autocommit);
// a batch that writes and ends outside a transaction (pgx sends a batch
// without BEGIN as one implicit transaction). Reads and idle polls commit
// nothing durable and are not counted, so the count follows the workload,
// not the clock.
type commitTracer struct {
	mu    sync.Mutex
	wrote map[*pgx.Conn]string // the first writing statement of the open transaction
}

var (
	_ pgx.QueryTracer = (*commitTracer)(nil)
	_ pgx.BatchTracer = (*commitTracer)(nil)
)

type commitKey struct{}

// pending is a counted commit awaiting its outcome.
type pending struct {
	n     int64
	label string
}

func (c *commitTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := strings.ToLower(strings.TrimSpace(data.SQL))
	inTx := conn.PgConn().TxStatus() != 'I'
	switch {
	case strings.HasPrefix(sql, "begin"):
		c.set(conn, "")
	case sql == "commit":
		if label := c.take(conn); label != "" {
			return c.before(ctx, label)
		}
	case Writes(sql):
		if !inTx {
			return c.before(ctx, data.SQL)
		}
		c.note(conn, data.SQL)
	}
	return ctx
}

func (c *commitTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	c.after(ctx)
}

func (c *commitTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	inTx := conn.PgConn().TxStatus() != 'I'
	label := c.take(conn)
	open := inTx
	for _, q := range data.Batch.QueuedQueries {
		sql := strings.ToLower(strings.TrimSpace(q.SQL))
		switch {
		case strings.HasPrefix(sql, "begin"):
			open, label = true, ""
		case sql == "commit":
			open = false
		case Writes(sql):
			label = CommitLabel(label, q.SQL)
		}
	}
	if open {
		c.set(conn, label) // the transaction goes on after the batch
		return ctx
	}
	if label == "" {
		return ctx
	}
	return c.before(ctx, label)
}

func (c *commitTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *commitTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	c.after(ctx)
}

func (c *commitTracer) before(ctx context.Context, label string) context.Context {
	label = strings.Join(strings.Fields(label), " ")
	if len(label) > 120 {
		label = label[:120]
	}
	return context.WithValue(ctx, commitKey{}, pending{n: faults.BeforeCommit(label), label: label})
}

func (c *commitTracer) after(ctx context.Context) {
	if p, ok := ctx.Value(commitKey{}).(pending); ok {
		faults.AfterCommit(p.n, p.label)
	}
}

func (c *commitTracer) set(conn *pgx.Conn, label string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if label == "" {
		delete(c.wrote, conn)
		return
	}
	c.wrote[conn] = label
}

func (c *commitTracer) note(conn *pgx.Conn, sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wrote[conn] = CommitLabel(c.wrote[conn], sql)
}

// CommitLabel picks the label of a commit: its first writing statement,
// or a later one when the first is the fence that opens every write of an
// execution, alone or with the session's lock (promptline_fence,
// promptline_finish_open: it says nothing of what the transaction
// writes). Exported for
// the test proxy (internal/testkit/pgproxy), which finds the same commits
// on the wire.
func CommitLabel(label, sql string) string {
	if label == "" || (opening(label) && !opening(sql)) {
		return sql
	}
	return label
}

func opening(sql string) bool {
	return strings.Contains(sql, "promptline_fence") || strings.Contains(sql, "promptline_finish_open")
}

func (c *commitTracer) take(conn *pgx.Conn) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	label := c.wrote[conn]
	delete(c.wrote, conn)
	return label
}

// Writes reports whether a statement (lower case) changes durable state:
// DML, or a call of one of promptline's writing functions: the commit
// boundary's rule, shared by the commit tracer and the test proxy.
func Writes(sql string) bool {
	for _, p := range []string{"insert", "update", "delete", "merge"} {
		if strings.HasPrefix(sql, p) {
			return true
		}
	}
	if strings.HasPrefix(sql, "with") {
		return strings.Contains(sql, "insert") || strings.Contains(sql, "update") || strings.Contains(sql, "delete")
	}
	for _, f := range readingFunctions {
		sql = strings.ReplaceAll(sql, f, "")
	}
	return strings.Contains(sql, "promptline_")
}

// readingFunctions are promptline's functions that only read: a read that
// calls them (the executor's view of the session, the read of the waiting
// inputs a promotion runs first) commits nothing, and must not label the
// transaction whose first write comes after it.
var readingFunctions = []string{"promptline_waiting_head("}
