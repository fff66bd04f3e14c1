package ledger

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/startstop"
)

// The ledger (attempts and tool calls) is evidence for recovery while an
// execution may still be recovered or continued, and history for `session
// show` after. Without pruning it grows by every provider step and tool
// call ever made, and every per-session statement on it reads the
// session's whole history. The Pruner deletes, per execution and whole,
// the rows of executions that nothing can need again:
//
//   - the session is idle: no claim (live, expired or quarantined: recovery
//     reads the claim's execution and the session's unsettled calls) and
//     no waiting input;
//   - every attempt of the execution settled (succeeded, failed, unknown:
//     recovery sets unknown when it reconciles) and finished before the
//     cutoff, so no started or deferred attempt (an uncertain or pending
//     request) is ever removed (a finished_at that is not a time,
//     '-infinity' or 'infinity' by a hand edit, a restore or a repair
//     script, says nothing of when: it is before any cutoff, else
//     'infinity' would keep the execution for good);
//   - every tool call of its attempts settled (succeeded, failed, unknown,
//     interrupted) and finished before the cutoff, and none has a
//     permission request (that table keeps its requests, which name the
//     call; a parked call is requested, so unsettled, anyway);
//   - no recovery continued it without its continuation having been
//     promoted yet (the continuation reads the retried attempt's
//     idempotency key, and a quarantined continuation may be released).
//
// Such an execution's rows are frozen: an execution writes only while it
// holds its claim, and recovery writes an execution's rows only in the
// transaction that takes its claim over. So the check and the delete need
// no lock on the session. Recovery decisions (table recoveries) are kept:
// they carry their own evidence, for `recovery explain`.

const (
	ledgerPruneBatchDefault      = 500
	ledgerPruneMaxBatchesDefault = 100
	ledgerPruneIntervalMax       = time.Minute
)

// PrunerConfig configures a Pruner.
type PrunerConfig struct {
	// Retention is how long a settled execution's ledger rows are kept
	// after its last one finished; it must be positive.
	Retention time.Duration
	// Interval is the time between passes. Defaults to the retention, at
	// most a minute.
	Interval time.Duration
	// BatchSize is the most executions one batch looks at (one short
	// statement each). Defaults to 500.
	BatchSize int
	// MaxBatches bounds the batches of one pass; the next pass goes on
	// from there. Defaults to 100.
	MaxBatches int
	// Logger receives failed passes (Warn). Defaults to discarding.
	Logger *slog.Logger
	// OnPruned, when set, is called after each batch that deleted rows,
	// with the attempts and tool calls it removed. Defaults to nothing.
	OnPruned func(attempts, calls int)
}

// PruneLockKey is the advisory lock (single bigint form) each ledger
// pruning batch tries to take in its transaction: every consumer runs a
// pruner, and one that finds another's batch running ends its pass instead
// of walking the same rows. "ldgprn" in ASCII.
const PruneLockKey int64 = 0x6c646770726e

// Pruner deletes the ledger rows of settled executions older than the
// retention. Every consumer runs one; at any moment one of them prunes
// (PruneLockKey).
type Pruner struct {
	pool *pgxpool.Pool
	cfg  PrunerConfig
	// after is where the walk over executions goes on: it is ordered by
	// execution ID, which says nothing of age, so a pass never stops
	// early; each pass goes on from the last, and the walk starts again
	// when it reaches the end. Executions kept (young, unsettled, claimed)
	// are stepped over, so they never stop the walk (invariant 10).
	after string

	loop startstop.Loop
}

// NewPruner returns a Pruner, or an error when the retention is not positive.
func NewPruner(pool *pgxpool.Pool, config *PrunerConfig) (*Pruner, error) {
	c := *config
	if c.Retention <= 0 {
		return nil, fmt.Errorf("ledger: PrunerConfig.Retention must be positive, not %v", c.Retention)
	}
	c.Interval = cmp.Or(c.Interval, min(c.Retention, ledgerPruneIntervalMax))
	c.BatchSize = cmp.Or(c.BatchSize, ledgerPruneBatchDefault)
	c.MaxBatches = cmp.Or(c.MaxBatches, ledgerPruneMaxBatchesDefault)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return &Pruner{pool: pool, cfg: c}, nil
}

// Prune runs one pass: at most MaxBatches batches of BatchSize executions
// each, in execution ID order from where the last pass ended, each one
// statement (its own transaction) that deletes the rows of the batch's
// prunable executions, tool calls and attempts together. It ends early at
// the end of the walk (the next pass starts over) or when another pruner
// holds PruneLockKey. It returns the attempts and tool calls removed. Not
// safe for concurrent use: the loop of Start calls it from one goroutine.
func (p *Pruner) Prune(ctx context.Context) (attempts, calls int, err error) {
	for range p.cfg.MaxBatches {
		var (
			a, c int
			last *string
			ok   bool
		)
		err := pgdb.InTx(ctx, p.pool, func(tx pgx.Tx) error {
			// The lock in a statement of its own, before the prune's: a
			// statement's snapshot is taken before it runs, so a resolve
			// (which takes the lock to re-arm a call) committed between
			// the prune statement's snapshot and its lock would be judged
			// on the call as it was, unknown, and the re-armed call
			// deleted under the continuation that runs it. Held first,
			// the lock makes the prune statement see every resolve that
			// committed, and keeps out the rest.
			if err := tx.QueryRow(ctx, pruneLockSQL, PruneLockKey).Scan(&ok); err != nil || !ok {
				return err
			}
			if _, err := tx.Exec(ctx, pruneSettingsSQL); err != nil {
				return err
			}
			return tx.QueryRow(ctx, pruneSQL, p.after, p.cfg.BatchSize, p.cfg.Retention.Milliseconds(), PruneLockKey).
				Scan(&a, &c, &last, &ok)
		})
		if err != nil {
			return attempts, calls, fmt.Errorf("ledger: pruning settled executions: %w", err)
		}
		attempts, calls = attempts+a, calls+c
		if a > 0 && p.cfg.OnPruned != nil {
			p.cfg.OnPruned(a, c)
		}
		if !ok {
			break
		}
		if last == nil {
			p.after = ""
			break
		}
		p.after = *last
	}
	return attempts, calls, nil
}

// Start prunes every Interval, in a goroutine, until ctx ends or Stop is
// called; it returns at once, and fails while the pruner runs. A stopped
// pruner may be started again, and goes on with the walk where it ended.
func (p *Pruner) Start(ctx context.Context) error {
	if err := p.loop.Start(ctx, p.run); err != nil {
		return fmt.Errorf("starting ledger pruner: %w", err)
	}
	return nil
}

// Stop ends the pruning loop, cancelling a pass under way, and waits for
// it. It may be called twice, and before Start.
func (p *Pruner) Stop() { p.loop.Stop() }

func (p *Pruner) run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a, c, err := p.Prune(ctx)
		if err != nil && ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "ledger pruning failed; retrying at the next interval", slog.Any("error", err))
		}
		if a > 0 {
			p.cfg.Logger.InfoContext(ctx, "ledger pruned", slog.Int("attempts", a), slog.Int("tool_calls", c))
		}
	}
}

// pruneLockSQL tries PruneLockKey for the transaction.
const pruneLockSQL = `SELECT pg_try_advisory_xact_lock($1)`

// pruneSettingsSQL makes the planner reach every row of pruneSQL through
// an index (every access path has one: migration 00010). Without
// statistics (a new database, a table autovacuum has not analysed yet) it
// otherwise hashed whole ledger tables for one batch of executions; the
// cost is that of the scan, not of the rows pruned. It applies to this
// transaction only.
const pruneSettingsSQL = `SET LOCAL enable_seqscan = off`

// pruneSQL takes the next $2 executions by ID after $1 (an index range on
// attempts_execution, which never runs past the batch), deletes the rows
// of those that nothing can need again (see the top of this file) and
// whose rows all finished before now() - $3 ms, tool calls with their
// attempts in the same statement, and reports the attempts and calls
// deleted, the batch's last execution ID (none at the end of the walk) and
// whether it held $4 (if not, it read and deleted nothing).
const pruneSQL = `
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($4) AS ok
), cut AS (
    SELECT now() - $3 * interval '1 millisecond' AS at
), batch AS (
    SELECT execution_id, min(session_id) AS session_id FROM attempts
    WHERE execution_id > $1 AND (SELECT ok FROM lock)
    GROUP BY execution_id ORDER BY execution_id LIMIT $2
), judged AS (
    -- The conditions in the select list, so that each is a per-execution
    -- index probe, never a join that hashes a whole table.
    SELECT b.execution_id,
           NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = b.session_id)
           AND NOT EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.session_id = b.session_id)
           AND NOT EXISTS (SELECT 1 FROM recoveries r WHERE r.execution_id = b.execution_id
                           AND r.continuation_message_id IS NOT NULL AND r.settled_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.execution_id = b.execution_id
                           AND (a.state NOT IN ('succeeded', 'failed', 'unknown')
                                OR a.finished_at IS NULL
                                OR (a.finished_at >= (SELECT at FROM cut) AND isfinite(a.finished_at))))
           AND NOT EXISTS (SELECT 1 FROM attempts a JOIN tool_calls t ON t.attempt_id = a.attempt_id
                           WHERE a.execution_id = b.execution_id
                             AND (t.state NOT IN ('succeeded', 'failed', 'unknown', 'interrupted')
                                  OR t.finished_at IS NULL
                                  OR (t.finished_at >= (SELECT at FROM cut) AND isfinite(t.finished_at))
                                  OR EXISTS (SELECT 1 FROM permission_requests p WHERE p.call_id = t.call_id))) AS prunable
    FROM batch b
), doomed AS (
    SELECT coalesce(array_agg(execution_id) FILTER (WHERE prunable), '{}') AS ids FROM judged
), calls AS (
    DELETE FROM tool_calls t USING attempts a
    WHERE a.execution_id = ANY ((SELECT ids FROM doomed)::text[]) AND t.attempt_id = a.attempt_id
    RETURNING 1
), atts AS (
    DELETE FROM attempts a WHERE a.execution_id = ANY ((SELECT ids FROM doomed)::text[])
    RETURNING 1
)
SELECT (SELECT count(*) FROM atts), (SELECT count(*) FROM calls), (SELECT max(execution_id) FROM batch), (SELECT ok FROM lock)`
