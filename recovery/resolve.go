package recovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/transcript"
)

// Findings of an operator on an unknown tool call or provider attempt.
const (
	FindingRan       = "ran"
	FindingDidNotRun = "did_not_run"
)

// ResolutionContinuationPrefix starts the message ID of the continuation
// input a resolution admits: resolve-continue-<round>-<target ID>.
const ResolutionContinuationPrefix = "resolve-continue-"

// ResolutionContinuationID is the deterministic continuation input of a
// target's resolution round.
func ResolutionContinuationID(targetID string, round int) string {
	return ResolutionContinuationPrefix + strconv.Itoa(round) + "-" + targetID
}

// resolutionContinuationTakenID is the ID used when a prompt holds
// ResolutionContinuationID: with a space, which no prompt's message ID has
// (as ContinuationTakenID).
func resolutionContinuationTakenID(targetID string, round int) string {
	return "resolve-continue " + strconv.Itoa(round) + " " + targetID
}

// Errors of Resolve. Each leaves the database as it was.
var (
	// ErrSessionBusy: a claim (live, expired or quarantined) holds the
	// session; a consumer runs it, or recovery has not decided it yet.
	ErrSessionBusy = errors.New("the session is claimed")
	// ErrNotUnknown: the target's outcome is known; there is nothing to
	// resolve.
	ErrNotUnknown = errors.New("its outcome is not unknown")
	// ErrSuperseded: a newer turn of the session exists; the finding can no
	// longer continue the turn of the target.
	ErrSuperseded = errors.New("its turn was superseded by a newer turn")
	// ErrResolvedOtherwise: the target was resolved before with another
	// finding (or output).
	ErrResolvedOtherwise = errors.New("it was resolved before with another finding")
	// ErrLaterUnknown: a provider attempt or tool call of the target's
	// turn after the target is unknown too; a continuation would send its
	// step again, or go on past it, though no one vouched for it. Resolve
	// that one first.
	ErrLaterUnknown = errors.New("a later step of its turn is unknown too")
	// ErrUnknownAgain: the target is unknown again after the continuation
	// of its last round ran it; a finding must name the new round
	// (ResolveOpts.Round) to vouch for that run.
	ErrUnknownAgain = errors.New("it is unknown again after an earlier round's continuation")
	// ErrNoRound: the round named is neither recorded nor the target's
	// next one.
	ErrNoRound = errors.New("no such resolution round")
	// ErrContinuationWaits: another continuation or permission reply of the
	// session waits to run; resolve after it ran.
	ErrContinuationWaits = errors.New("another continuation of the session waits to run")
	// ErrPermissionPending: the session's turn is parked on a permission
	// ask, and its reply continues it; a continuation admitted meanwhile
	// would continue it a second time. Once the reply continued it, the
	// model has been told the unknown call's outcome is unknown, and the
	// turn went on past it (ErrSuperseded).
	ErrPermissionPending = errors.New("the session waits for a permission reply")
)

// ResolveOpts is one operator's finding.
type ResolveOpts struct {
	// Finding is FindingRan or FindingDidNotRun.
	Finding string
	// Output is a tool call's result when Finding is FindingRan (what the
	// model is handed); it must be empty for a provider attempt.
	Output string
	// Operator names who found it, recorded in the audit.
	Operator string
	// Note says how it was found out, recorded in the audit. Defaults to none.
	Note string
	// Round names the resolution round the finding is about. A target is
	// in round 1 until the continuation of a --did-not-run finding ran it
	// and its outcome was lost again: that new run is round 2 (and so on),
	// and only a finding that names it vouches for it; a finding without a
	// round is then refused (ErrUnknownAgain). Naming a round already
	// recorded is a no-op with the same finding. Defaults to the round the
	// target is in when it was never unknown again.
	Round int
	// Topics names the outbox targets of the continuation's wake and of
	// the session event a --ran finding writes. Defaults to kafkautil's
	// defaults.
	Topics kafkautil.Topics
	// OnTransientFunc is called with each transient database error
	// (pgdb.Transient) before the transaction is tried again. Defaults to
	// nothing.
	OnTransientFunc func(err error)
}

// resolveTries bounds the tries of Resolve's transaction on transient
// errors: an operator waits for the command, and may run it again.
const resolveTries = 5

// ResolveResult says what Resolve did.
type ResolveResult struct {
	Resolution Resolution `json:"resolution"`
	// Already is true when the same finding was recorded before: this call
	// changed nothing.
	Already bool `json:"already"`
}

// Resolution is one stored operator finding.
type Resolution struct {
	TargetID           string     `json:"target_id"`
	Round              int        `json:"round"`
	TargetKind         string     `json:"target_kind"`
	SessionID          string     `json:"session_id"`
	ExecutionID        string     `json:"execution_id"`
	AssistantMessageID string     `json:"assistant_message_id"`
	Finding            string     `json:"finding"`
	Output             string     `json:"output,omitempty"`
	StateBefore        string     `json:"state_before"`
	OutputBefore       string     `json:"output_before,omitempty"`
	ContinuationID     string     `json:"continuation_message_id,omitempty"`
	ResolvedBy         string     `json:"resolved_by"`
	Note               string     `json:"note,omitempty"`
	ResolvedAt         pgdb.Time  `json:"resolved_at"`
	SettledAt          *pgdb.Time `json:"settled_at,omitempty"`
	// ResolvedAtNotFinite and SettledAtNotFinite are those times when they
	// are not a time ('-infinity', 'infinity': a hand edit), the times
	// then zero, as Evidence.ExpiredAtNotFinite is a claim's expires_at.
	ResolvedAtNotFinite string `json:"resolved_at_not_finite,omitempty"`
	SettledAtNotFinite  string `json:"settled_at_not_finite,omitempty"`
}

// Resolve records an operator's finding on a tool call or provider attempt
// of session that was left unknown, and, when the turn can go on, admits
// one continuation of that turn with a wake, all in one transaction:
//
//   - a tool call that did not run is requested again: the continuation
//     runs it, once (its intent is committed before it runs, as always),
//     under its own idempotency key and the new claim's fencing token;
//   - a tool call that ran is settled with the given output, which the
//     continuation hands the model; nothing runs;
//   - a provider attempt that was not acted on fails "not sent": the
//     continuation sends its step again;
//   - a provider attempt that was acted on is recorded only: its answer is
//     lost, so the turn cannot go on (send the prompt again).
//
// It is an operator write, so it follows the single-writer rules
// (docs/design.md, invariants 5 and 7) without a claim of its own: it
// locks the session row first, as admission, claim acquisition, release
// and recovery do, and refuses while any claim holds the session
// (ErrSessionBusy): no execution can then write the session until it
// commits, and the next one to claim it finds the continuation (a steer,
// promoted before anything else). It refuses when a newer turn exists
// (ErrSuperseded), another continuation waits (ErrContinuationWaits), or
// an attempt or tool call of the turn after the target is unknown too
// (ErrLaterUnknown: the continuation would send that step again, which no
// one vouched for). The ledger pruner's lock is taken first, so the rows it reads cannot be
// pruned under it. Running it again with the same finding changes nothing
// (Already); with another finding it is refused (ErrResolvedOtherwise). A
// transient database error is retried, a few times, as a whole.
func Resolve(ctx context.Context, pool *pgxpool.Pool, sessionID, targetID string, opts *ResolveOpts) (ResolveResult, error) {
	if opts.Finding != FindingRan && opts.Finding != FindingDidNotRun {
		return ResolveResult{}, fmt.Errorf("finding %q: want %s or %s", opts.Finding, FindingRan, FindingDidNotRun)
	}
	if opts.Operator == "" {
		return ResolveResult{}, errors.New("resolving: the operator must be named")
	}
	if opts.Output != "" && opts.Finding != FindingRan {
		return ResolveResult{}, errors.New("resolving: an output goes only with the finding ran")
	}
	if opts.Round < 0 {
		return ResolveResult{}, fmt.Errorf("resolving: round %d: want 1 or more", opts.Round)
	}
	// The round the first try read is kept for the retries: one whose
	// commit landed unheard then finds its own round (Already), never a
	// next one, even if the continuation ran meanwhile.
	round := opts.Round
	for try := 1; ; try++ {
		res, err := resolveOnce(ctx, pool, sessionID, targetID, opts, &round)
		if err == nil || !pgdb.Transient(err) || try == resolveTries || ctx.Err() != nil {
			return res, err
		}
		// A lost connection, a lock timeout, a deadlock (invariant 13):
		// the transaction rolled back, so it is tried again as a whole;
		// one whose commit landed unheard is found resolved (Already).
		if f := opts.OnTransientFunc; f != nil {
			f(err)
		}
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
	}
}

// resolveOnce tries Resolve's transaction once, for the round *pinned (0:
// the round the target is in), and sets *pinned to the round it read.
func resolveOnce(ctx context.Context, pool *pgxpool.Pool, sessionID, targetID string, opts *ResolveOpts, pinned *int) (ResolveResult, error) {
	topics := opts.Topics.WithDefaults()
	var res ResolveResult
	err := pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		res = ResolveResult{}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, ledger.PruneLockKey); err != nil {
			return fmt.Errorf("taking the ledger pruner's lock: %w", err)
		}
		_, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: sessionID})
		if err != nil {
			return fmt.Errorf("locking session %s: %w", sessionID, err)
		}
		if !found {
			return fmt.Errorf("session %s: no such session", sessionID)
		}
		if err := refuseClaimed(ctx, tx, sessionID); err != nil {
			return err
		}
		t, err := ledger.ReadTarget(ctx, tx, targetID)
		if err != nil {
			return err
		}
		if t.SessionID != sessionID {
			return fmt.Errorf("%s belongs to session %s, not %s", targetID, t.SessionID, sessionID)
		}
		if t.Kind == ledger.TargetAttempt && opts.Output != "" {
			return fmt.Errorf("%s is a provider attempt: its answer cannot be given (--output is a tool call's result)", targetID)
		}
		prev, next, err := lastResolution(ctx, tx, targetID)
		if err != nil {
			return err
		}
		// The target is unknown again when the continuation of its last
		// round ran it (a re-armed call) and its outcome was lost once more:
		// a new occurrence, which that round's finding does not vouch for.
		again := prev != nil && t.State == string(ledger.CallUnknown) && prev.SettledAt != nil && prev.Finding == FindingDidNotRun
		round := *pinned
		switch {
		case round == 0 && prev != nil && !again:
			round = prev.Round // the same round: the target is as that finding left it
		case round == 0 && again:
			return fmt.Errorf("%s %s: %w: round %d's continuation ran it (fencing token %d) and its outcome was lost again; "+
				"round %d's finding does not vouch for that run: check it, then resolve it with --round %d; nothing was recorded",
				t.Kind, targetID, ErrUnknownAgain, prev.Round, t.Token, prev.Round, next)
		case round == 0:
			round = next
		}
		*pinned = round
		if round < next {
			earlier, err := resolutionRound(ctx, tx, targetID, round)
			if err != nil {
				return err
			}
			if earlier.Finding == opts.Finding && earlier.Output == opts.Output {
				res = ResolveResult{Resolution: earlier, Already: true}
				return nil
			}
			return fmt.Errorf("%s round %d: %w: %s by %s at %s", targetID, round, ErrResolvedOtherwise, earlier.Finding, earlier.ResolvedBy,
				earlier.ResolvedAt.UTC().Format(time.RFC3339))
		}
		if round > next || (prev != nil && !again) {
			latest := "it was never resolved"
			if prev != nil {
				latest = fmt.Sprintf("its latest is round %d (%s), and it is %s", prev.Round, prev.Finding, t.State)
			}
			return fmt.Errorf("%s %s: %w: no round %d to resolve: %s; nothing was recorded", t.Kind, targetID, ErrNoRound, round, latest)
		}
		if t.State != string(ledger.CallUnknown) {
			return fmt.Errorf("%s %s is %s: %w; there is nothing to resolve", t.Kind, targetID, t.State, ErrNotUnknown)
		}
		if err := refuseSuperseded(ctx, tx, t); err != nil {
			return err
		}
		if kind, id, err := ledger.LaterUnknown(ctx, tx, t); err != nil {
			return err
		} else if id != "" {
			return fmt.Errorf("%s %s: %w: %s %s is unknown; resolve %s %s first (a continuation of this finding would act on it unvouched); nothing was recorded",
				t.Kind, targetID, ErrLaterUnknown, kind, id, kind, id)
		}
		pending, err := admission.PendingPermissionRequest(ctx, tx, &admission.PendingPermissionRequestParams{SessionID: sessionID})
		if err != nil {
			return fmt.Errorf("reading pending permission requests: %w", err)
		}
		if pending != "" {
			return fmt.Errorf("session %s: %w (request %s), and the reply continues its turn; nothing was recorded",
				sessionID, ErrPermissionPending, pending)
		}
		waiting, err := admission.WaitingContinuation(ctx, tx, &admission.WaitingContinuationParams{SessionID: sessionID})
		if err != nil {
			return fmt.Errorf("reading waiting continuations: %w", err)
		}
		if waiting != "" {
			return fmt.Errorf("session %s: %w (input %s); resolve after it ran", sessionID, ErrContinuationWaits, waiting)
		}
		r := Resolution{TargetID: targetID, Round: round, TargetKind: t.Kind, SessionID: sessionID, ExecutionID: t.ExecutionID,
			AssistantMessageID: t.AssistantMessageID, Finding: opts.Finding, Output: opts.Output, StateBefore: t.State,
			OutputBefore: t.Output, ResolvedBy: opts.Operator, Note: opts.Note}
		continues := true
		switch {
		case t.Kind == ledger.TargetToolCall && opts.Finding == FindingDidNotRun:
			err = ledger.ResolveCallNotRun(ctx, tx, targetID)
		case t.Kind == ledger.TargetToolCall:
			err = ledger.ResolveCallRan(ctx, tx, t, opts.Output)
		case opts.Finding == FindingDidNotRun:
			err = ledger.ResolveAttemptNotSent(ctx, tx, targetID, "not sent (found by "+opts.Operator+"); sent again by the continuation")
		default:
			// Acted on, its answer lost: the finding is recorded, the
			// attempt stays unknown (nothing says what it answered).
			continues = false
		}
		if err != nil {
			return err
		}
		if continues {
			if r.ContinuationID, err = admitResolutionContinuation(ctx, tx, sessionID, targetID, round); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, `INSERT INTO resolutions (target_id, round, target_kind, session_id, execution_id,
				assistant_message_id, finding, output, state_before, output_before, continuation_message_id, resolved_by, note)
			VALUES ($1, $2, $3, $4, $5, $6, $7, nullif($8, ''), $9, nullif($10, ''), nullif($11, ''), $12, nullif($13, ''))
			RETURNING resolved_at`,
			r.TargetID, r.Round, r.TargetKind, r.SessionID, r.ExecutionID, r.AssistantMessageID, r.Finding, r.Output,
			r.StateBefore, r.OutputBefore, r.ContinuationID, r.ResolvedBy, r.Note).Scan(&r.ResolvedAt); err != nil {
			return fmt.Errorf("recording the resolution of %s: %w", targetID, err)
		}
		res = ResolveResult{Resolution: r}
		if !continues {
			return nil
		}
		rows := []outbox.Row{outbox.WakeRow(topics.Wakes, sessionID, "resolve", time.Now().UTC())}
		if t.Kind == ledger.TargetToolCall && opts.Finding == FindingRan {
			// The call's outcome is succeeded from now on: its
			// tool.completed, named after the finding (an earlier outcome
			// of the call, unknown, has an ID of its own).
			turnID, err := transcript.ReadTurnID(ctx, tx, &transcript.TurnIDParams{MessageID: t.AssistantMessageID})
			if err != nil {
				return fmt.Errorf("reading the turn of %s: %w", targetID, err)
			}
			rows = append([]outbox.Row{outbox.EventRow(topics.Events, envelope.Event{
				ID: "tool.completed:" + targetID + "@resolve-" + strconv.Itoa(round), Type: envelope.EventToolCompleted,
				SessionID: sessionID, At: time.Now().UTC(), TurnID: turnID, CallID: targetID, ModelCallID: t.ModelCallID,
				Tool: t.Tool, Class: t.Class, Outcome: string(ledger.CallSucceeded),
			})}, rows...)
		}
		return outbox.Insert(ctx, tx, rows...)
	})
	return res, err
}

// refuseClaimed fails when a claim holds the session: its holder (or
// recovery, once it expired) is the session's one writer.
func refuseClaimed(ctx context.Context, tx pgx.Tx, sessionID string) error {
	c, found, err := ledger.ReadSessionClaim(ctx, tx, &ledger.SessionClaimParams{SessionID: sessionID})
	if err != nil {
		return err
	}
	if !found {
		return nil
	}
	why := "a consumer is running it; resolve after its turn ended"
	until := c.ExpiresNotFinite
	if until == "" {
		until = c.ExpiresAt.UTC().Format(time.RFC3339)
	}
	switch {
	case c.Quarantined:
		why = "the claim is quarantined; repair and release it (consumer quarantine release), let recovery decide it, then resolve"
	case c.ExpiresNotFinite != "":
		why = "its lease is not a time; recovery quarantines it: repair and release it (consumer quarantine release), let recovery decide it, then resolve"
	case !c.ExpiresAt.After(time.Now()):
		why = "its lease expired; recovery has not decided it yet (consumer recover), then resolve"
	}
	return fmt.Errorf("session %s: %w by execution %s (owner %s, phase %s, lease until %s): %s; nothing was recorded",
		sessionID, ErrSessionBusy, c.ExecutionID, c.OwnerID, c.Phase, until, why)
}

// refuseSuperseded fails when the session has an assistant message newer
// than the target's step, other than the errored rest of the same turn (a
// turn that failed after the step): the finding can no longer continue it.
func refuseSuperseded(ctx context.Context, tx pgx.Tx, t ledger.Target) error {
	n, found, err := transcript.ReadNewerStep(ctx, tx, &transcript.NewerStepParams{MessageID: t.AssistantMessageID})
	if err != nil {
		return fmt.Errorf("reading newer assistant messages: %w", err)
	}
	if !found {
		return nil
	}
	newer := n.MessageID
	if n.SameTurn {
		// The turn went on past the call: the model was told that its
		// outcome is unknown and answered after it.
		return fmt.Errorf("%s %s: %w: the turn went on past it (assistant message %s answered after its step's %s); nothing was recorded",
			t.Kind, t.ID, ErrSuperseded, newer, t.AssistantMessageID)
	}
	return fmt.Errorf("%s %s: %w (assistant message %s is newer than its step's %s); nothing was recorded",
		t.Kind, t.ID, ErrSuperseded, newer, t.AssistantMessageID)
}

// lastResolution reads the target's latest resolution (nil when none) and
// the round a new one would take.
func lastResolution(ctx context.Context, tx pgx.Tx, targetID string) (*Resolution, int, error) {
	rows, err := tx.Query(ctx, resolutionsSQL+` WHERE target_id = $1 ORDER BY round DESC LIMIT 1`, targetID)
	if err != nil {
		return nil, 0, fmt.Errorf("reading resolutions of %s: %w", targetID, err)
	}
	rs, err := scanResolutions(rows)
	if err != nil || len(rs) == 0 {
		return nil, 1, err
	}
	return &rs[0], rs[0].Round + 1, nil
}

// resolutionRound reads the target's resolution of round.
func resolutionRound(ctx context.Context, tx pgx.Tx, targetID string, round int) (Resolution, error) {
	rows, err := tx.Query(ctx, resolutionsSQL+` WHERE target_id = $1 AND round = $2`, targetID, round)
	if err != nil {
		return Resolution{}, fmt.Errorf("reading round %d of %s: %w", round, targetID, err)
	}
	rs, err := scanResolutions(rows)
	if err != nil {
		return Resolution{}, err
	}
	if len(rs) == 0 {
		return Resolution{}, fmt.Errorf("%s: %w: round %d is not recorded", targetID, ErrNoRound, round)
	}
	return rs[0], nil
}

// admitResolutionContinuation admits the round's continuation input (kind
// continuation, a steer, wake pending), as admitContinuation does: a
// second admission is an exact retry, an ID held by another input is never
// taken for this one.
func admitResolutionContinuation(ctx context.Context, tx pgx.Tx, sessionID, targetID string, round int) (string, error) {
	h := sha256.Sum256([]byte("resolution:" + sessionID + ":" + targetID + ":" + strconv.Itoa(round)))
	for _, id := range []string{ResolutionContinuationID(targetID, round), resolutionContinuationTakenID(targetID, round)} {
		p := &admission.AdmitContinuationParams{MessageID: id, SessionID: sessionID, PayloadHash: h[:]}
		held, err := admission.AdmitContinuation(ctx, tx, p)
		if err != nil {
			return "", err
		}
		if held.Is(p) {
			return id, nil
		}
	}
	return "", fmt.Errorf("continuation input of the resolution of %s: both IDs are held by other inputs", targetID)
}

// Resolutions reads a session's resolutions, oldest first.
func Resolutions(ctx context.Context, pool *pgxpool.Pool, sessionID string) ([]Resolution, error) {
	rows, err := pool.Query(ctx, resolutionsSQL+` WHERE session_id = $1 ORDER BY resolved_at, target_id, round`, sessionID)
	if err != nil {
		return nil, fmt.Errorf("reading resolutions of %s: %w", sessionID, err)
	}
	return scanResolutions(rows)
}

func scanResolutions(rows pgx.Rows) ([]Resolution, error) {
	var out []Resolution
	var r Resolution
	_, err := pgx.ForEachRow(rows, []any{&r.TargetID, &r.Round, &r.TargetKind, &r.SessionID, &r.ExecutionID, &r.AssistantMessageID,
		&r.Finding, &r.Output, &r.StateBefore, &r.OutputBefore, &r.ContinuationID, &r.ResolvedBy, &r.Note, &r.ResolvedAt, &r.SettledAt}, func() error {
		r.ResolvedAtNotFinite, r.SettledAtNotFinite = r.ResolvedAt.NotFinite, ""
		if r.SettledAt != nil {
			r.SettledAtNotFinite = r.SettledAt.NotFinite
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading resolutions: %w", err)
	}
	return out, nil
}

const resolutionsSQL = `
SELECT target_id, round, target_kind, session_id, execution_id, assistant_message_id, finding, coalesce(output, ''),
       state_before, coalesce(output_before, ''), coalesce(continuation_message_id, ''), resolved_by, coalesce(note, ''),
       resolved_at, settled_at
FROM resolutions`
