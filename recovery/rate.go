package recovery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// The recovery rate (Config.Rate, --recovery-rate) is a token bucket in
// Postgres (recovery_rate, one row), not a per-process share: a share needs
// every process to know how many others run (and to be told again at each
// rebalance, crash or scale-out), and a fleet of N processes that each
// believe they are alone sends N times the rate. One row shared by the
// whole fleet bounds the fleet whatever its size, with no membership to
// keep. Its cost is a row every paced decision updates: one short UPDATE
// per continuation or re-wake, which at the rates the bucket exists for
// (hundreds per second) Postgres serves many times over.
//
// A token is taken in the decision's own transaction, so a decision that
// rolls back (a crash after the take and before the commit, a failed
// statement, a transient error) gives its token back with the rest; a
// token is spent only by a decision that committed.
//
// The bucket is never waited for under a lock: the take reads the row FOR
// UPDATE SKIP LOCKED, so a pass that finds the bucket held by another
// decision's transaction (or empty) is told so at once, rolls its decision
// back (releasing the session's and the claim's locks) and waits, holding
// nothing, before it tries that claim again. A paused process holding the
// bucket (a zombie between its take and its commit) thus stops no one from
// deciding for free (quarantines, reconciles with nothing queued); it
// delays the paced decisions until its transaction ends, at most
// --db-idle-in-transaction-timeout, and its rollback returns its token.

// rateBurst is the bucket's capacity at rate tokens per second: one
// second's worth, at least one token. After a long calm the fleet may send
// this many at once, then the rate: a ramp, not a wall.
func rateBurst(rate float64) float64 { return math.Max(1, rate) }

// maxRate bounds the rate the bucket computes with: a configured rate
// above it is as good as unbounded, and the refill (rate times the seconds
// since the last take) must stay well inside float8 (Postgres raises on an
// overflow, a deterministic error that would quarantine every paced claim).
const maxRate = 1e9

// maxTokenWait bounds the wait for the next token: at a tiny rate the wait
// in nanoseconds overflows a time.Duration (negative: a pass that never
// reaches its deadline); any wait past the pass's budget defers alike.
const maxTokenWait = 24 * time.Hour

// rateBusyWait is how long a pass waits before trying again when another
// transaction holds the bucket: that one commits within a statement or two.
const rateBusyWait = 5 * time.Millisecond

// takeTokensSQL refills the bucket at $1 per second up to $2 and takes up
// to $3 whole tokens, unless another transaction holds the row (free is
// then false and nothing changed). clock_timestamp, not now(): now() is
// the start of the decision's transaction, which may be older than the
// last take. LIMIT 1 keeps the planner's estimate at one row: on the
// table's default estimate (some two thousand rows, joined with itself)
// the plan's cost passed jit_above_cost, and compiling it cost fifty times
// the statement's own work (measured: 14 ms a take against 0.2). An
// updated_at that is not a time (a hand edit: the column admits
// '-infinity' and 'infinity') says nothing about when the last take was,
// and the clock cannot be subtracted from it (a data error, which would
// quarantine every paced claim): the bucket is then full, the burst it
// allows after any long calm, and the take sets a time again. So is a
// tokens of 'NaN' or 'Infinity' (the column's CHECK admits both: Postgres
// orders NaN above every number): least(), not the refill, caps the
// bucket and reads either as full, and the take writes a number again.
const takeTokensSQL = `
WITH b AS (
    SELECT CASE WHEN isfinite(updated_at)
                THEN least($2::float8, tokens + $1::float8 * greatest(0, extract(epoch FROM clock_timestamp() - updated_at)))
                ELSE $2::float8 END AS have
    FROM recovery_rate WHERE singleton LIMIT 1 FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE recovery_rate SET tokens = b.have - least(floor(b.have), $3::int), updated_at = clock_timestamp()
    FROM b WHERE recovery_rate.singleton RETURNING least(floor(b.have), $3::int)::int AS got, recovery_rate.tokens AS rest, recovery_rate.updated_at AS at
)
SELECT EXISTS (SELECT 1 FROM b), coalesce((SELECT got FROM u), 0), coalesce((SELECT rest FROM u), 0), (SELECT at FROM u)`

// ensureBucketSQL puts the bucket's row back if it is missing (the
// migration creates it): without it every paced decision would wait for
// good. Only when a plain read (which waits for no lock) finds no row: an
// INSERT ... ON CONFLICT would wait for a taker's uncommitted UPDATE of
// the row (a zombie's), and with it the whole pass.
const ensureBucketSQL = `INSERT INTO recovery_rate (tokens) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM recovery_rate)
ON CONFLICT (singleton) DO NOTHING`

// taken is what a take got: got tokens at at, or, when got is short,
// after is how long until the next one can be had.
type taken struct {
	got   int
	at    time.Time
	after time.Duration
}

// takeTokens takes up to n tokens at the configured rate in tx, never
// waiting for the bucket's row.
func (r *Recoverer) takeTokens(ctx context.Context, tx pgx.Tx, n int) (taken, error) {
	var (
		free bool
		t    taken
		left float64
		at   *time.Time
	)
	rate := math.Min(r.cfg.Rate, maxRate)
	if err := tx.QueryRow(ctx, takeTokensSQL, rate, rateBurst(rate), n).Scan(&free, &t.got, &left, &at); err != nil {
		return t, fmt.Errorf("taking recovery tokens: %w", err)
	}
	if at != nil {
		t.at = *at
	}
	switch {
	case !free:
		t.after = rateBusyWait
	case t.got < n:
		t.after = maxTokenWait
		if s := (1 - left) / rate; s < maxTokenWait.Seconds() {
			t.after = time.Duration(s * float64(time.Second))
		}
	}
	return t, nil
}

// noTokenError rolls back a paced decision that found no token: the pass
// tries the claim again after After, holding nothing meanwhile.
type noTokenError struct{ After time.Duration }

func (e *noTokenError) Error() string {
	return fmt.Sprintf("no recovery token (--recovery-rate): the next in %s", e.After)
}

// errDeferred says that a paced decision was left for the next pass: the
// bucket gave no token within the pass's budget.
var errDeferred = errors.New("left for the next pass: no recovery token within the pass")

// paced reports whether a decision costs a token: exactly those that wake
// the session (record writes the wake), because a wake is what sends work
// to a provider: a continuation, a re-armed ready claim, and a clear,
// supersede or reconcile whose session has inputs waiting (their wake runs
// the next prompt). A quarantine, and a clear or reconcile with nothing
// waiting, send nothing and are never held back.
func paced(ev Evidence, d Decision) bool {
	return d.Decision != DecisionQuarantined && wakes(ev, d)
}

// wakes reports whether a decision's record writes a wake.
func wakes(ev Evidence, d Decision) bool { return ev.WaitingInputs > 0 || d.ContinuationID != "" }

// waitCtx waits d or until ctx ends.
func waitCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
