package admission

import (
	"context"
	"sync/atomic"

	"github.com/promptline/promptline/internal/groupflush"
	"github.com/promptline/promptline/outbox"
)

// Group admits the batches of several partitions together: each
// partition's goroutine takes the prompts it has at hand, and under light
// load that is one or two, so every prompt paid a transaction of its own
// (three round trips and a commit). Batches that wait while a transaction
// runs are admitted together in the next one, up to maxBatch prompts.
// Measured on the end-to-end bench (docs/benchmarks.md).
//
// Nothing else changes: each partition still waits for its batch's commit
// before it marks its offset and takes its next batch, so its order holds;
// the combined transaction locks the sessions of all its batches in sorted
// order, as one batch does. A combined transaction that fails fails every
// batch in it, and each partition retries its own, as before (admission is
// idempotent). There is no background goroutine (groupflush.Queue): a
// sender that finds fewer than maxAdmitInFlight transactions running starts
// one, which drains the queue and ends.
type Group struct {
	admitter    *Admitter
	afterCommit func(wakes []outbox.Row)
	queue       groupflush.Queue[*admitRequest]

	// For tests: the transactions run.
	transactions atomic.Int64
}

type admitRequest struct {
	ctx      context.Context
	batch    []Incoming
	outcomes []Outcome
	err      error
	done     chan struct{}
}

// maxAdmitInFlight bounds the combined admission transactions running at
// once; batches of at least soloBatch prompts are admitted alone, at once,
// as before: they amortise their transaction already, and under a backlog
// (full batches on every partition) combining them only took parallelism
// away (measured: admission / raw ceiling 0.59–0.62 against 0.80–0.81).
const (
	maxAdmitInFlight = 2
	soloBatch        = 64
)

// MaxBatchBytesDefault bounds the prompts' text admitted in one
// transaction (pipeline.ConsumerConfig.MaxBatchBytes; combined batches in
// Group). By count alone, 500 prompts of a megabyte were one admission of
// 500 MB: 23 s and 1.4 GB of heap above the batch itself (measured), near
// the statement timeout, past which the same batch failed at every retry.
const MaxBatchBytesDefault = 16 << 20

// NewGroup admits through admitter, at most maxBatch prompts a transaction
// (and MaxBatchBytesDefault of their text, combining batches); afterCommit,
// when not nil, runs right after each commit with the wake rows it
// committed.
func NewGroup(admitter *Admitter, maxBatch int, afterCommit func(wakes []outbox.Row)) *Group {
	g := &Group{admitter: admitter, afterCommit: afterCommit}
	g.queue = groupflush.Queue[*admitRequest]{
		Max: maxAdmitInFlight,
		Take: func(queued []*admitRequest) int {
			return takeBatches(queued, maxBatch, MaxBatchBytesDefault)
		},
		Flush: g.flush,
	}
	return g
}

// takeBatches is how many of the queued batches one transaction admits:
// whole batches, up to maxBatch prompts and maxBytes of their text (at
// least one batch).
func takeBatches(queued []*admitRequest, maxBatch, maxBytes int) int {
	n, size, bytes := 0, 0, 0
	for n < len(queued) {
		b := textBytes(queued[n].batch)
		if n > 0 && (size+len(queued[n].batch) > maxBatch || bytes+b > maxBytes) {
			break
		}
		size += len(queued[n].batch)
		bytes += b
		n++
	}
	return n
}

func textBytes(batch []Incoming) int {
	n := 0
	for _, in := range batch {
		n += len(in.Prompt.Text)
	}
	return n
}

// Admit admits batch, with the batches of other partitions that wait, and
// returns its outcomes.
func (g *Group) Admit(ctx context.Context, batch []Incoming) ([]Outcome, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	if len(batch) >= soloBatch {
		g.transactions.Add(1)
		return g.admitter.admit(ctx, batch, g.afterCommit)
	}
	r := &admitRequest{ctx: ctx, batch: batch, done: make(chan struct{})}
	g.queue.Add(r)
	<-r.done
	return r.outcomes, r.err
}

func (g *Group) flush(reqs []*admitRequest) {
	// A partition whose assignment ended meanwhile is not admitted: its
	// next owner redelivers the batch.
	live := reqs[:0:0]
	for _, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	var all []Incoming
	for _, r := range live {
		all = append(all, r.batch...)
	}
	// Every sender is a partition of the same consumer-group session (Sarama
	// ends one session's partitions before it starts the next), so they
	// share its cancellation: a rebalance or shutdown ends the transaction,
	// and each partition's batch is redelivered to its next owner.
	g.transactions.Add(1)
	outcomes, err := g.admitter.admit(latestDeadline(live), all, g.afterCommit)
	for _, r := range live {
		if err != nil {
			r.err = err
		} else {
			r.outcomes, outcomes = outcomes[:len(r.batch):len(r.batch)], outcomes[len(r.batch):]
		}
		close(r.done)
	}
}

// latestDeadline is the context, of reqs', whose deadline comes last (one
// without a deadline before all): each try's deadline bounds that try
// from its start, time in the queue included, so under the first batch's
// a try that had waited close to its bound cut the whole transaction
// short, and every partition in it retried, under an overload that only
// made the wait longer. A sender whose own deadline passes meanwhile
// still waits for the outcome, bounded by the deadline chosen.
func latestDeadline(reqs []*admitRequest) context.Context {
	ctx := reqs[0].ctx
	last, bounded := ctx.Deadline()
	for _, r := range reqs[1:] {
		if !bounded {
			break
		}
		d, ok := r.ctx.Deadline()
		if !ok || d.After(last) {
			ctx, last, bounded = r.ctx, d, ok
		}
	}
	return ctx
}

// AdmitAlone admits batch in a transaction of its own.
func (g *Group) AdmitAlone(ctx context.Context, batch []Incoming) ([]Outcome, error) {
	return g.admitter.admit(ctx, batch, g.afterCommit)
}
