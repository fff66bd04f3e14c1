package recovery

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
)

// Record is one stored recovery decision.
type Record struct {
	ExecutionID    string       `json:"execution_id"`
	SessionID      string       `json:"session_id"`
	PhaseFound     string       `json:"phase_found"`
	Decision       DecisionKind `json:"decision"`
	Rule           string       `json:"rule,omitempty"`
	Evidence       Evidence     `json:"evidence"`
	TokenBefore    int64        `json:"token_before"`
	TokenAfter     int64        `json:"token_after"`
	ContinuationID string       `json:"continuation_message_id,omitempty"`
	RetryAttemptID string       `json:"retry_attempt_id,omitempty"`
	RecoveredBy    string       `json:"recovered_by"`
	DecidedAt      pgdb.Time    `json:"decided_at"`
	SettledAt      *pgdb.Time   `json:"settled_at,omitempty"`
	// DecidedAtNotFinite and SettledAtNotFinite are those times when they
	// are not a time ('-infinity', 'infinity': a hand edit), the times
	// then zero, as Evidence.ExpiredAtNotFinite is a claim's expires_at.
	DecidedAtNotFinite string `json:"decided_at_not_finite,omitempty"`
	SettledAtNotFinite string `json:"settled_at_not_finite,omitempty"`
	QuarantineReason   string `json:"quarantine_reason,omitempty"`
	// Resolutions are the operators' findings on what this execution left
	// unknown (consumer session resolve).
	Resolutions []Resolution `json:"resolutions,omitempty"`
}

// Records reads a session's recovery decisions, oldest first.
func Records(ctx context.Context, pool *pgxpool.Pool, sessionID string) ([]Record, error) {
	rows, err := pool.Query(ctx, `SELECT execution_id, session_id, phase_found, decision, coalesce(rule, ''), evidence,
		token_before, token_after, coalesce(continuation_message_id, ''), coalesce(retry_attempt_id, ''), recovered_by,
		decided_at, settled_at, coalesce(quarantine_reason, '')
		FROM recoveries WHERE session_id = $1 ORDER BY decided_at, execution_id`, sessionID)
	if err != nil {
		return nil, fmt.Errorf("reading recoveries of %s: %w", sessionID, err)
	}
	var out []Record
	var r Record
	var ev []byte
	_, err = pgx.ForEachRow(rows, []any{&r.ExecutionID, &r.SessionID, &r.PhaseFound, &r.Decision, &r.Rule, &ev,
		&r.TokenBefore, &r.TokenAfter, &r.ContinuationID, &r.RetryAttemptID, &r.RecoveredBy, &r.DecidedAt, &r.SettledAt,
		&r.QuarantineReason}, func() error {
		r.DecidedAtNotFinite, r.SettledAtNotFinite = r.DecidedAt.NotFinite, ""
		if r.SettledAt != nil {
			r.SettledAtNotFinite = r.SettledAt.NotFinite
		}
		r.Evidence = Evidence{}
		if err := json.Unmarshal(ev, &r.Evidence); err != nil {
			return fmt.Errorf("recovery of %s: evidence: %w", r.ExecutionID, err)
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// Explanation is what `consumer recovery explain` shows of a session: its
// recovery decisions, each with the resolutions of its execution, and the
// resolutions of executions that no recovery decided (a turn that a
// shutdown left unknown).
type Explanation struct {
	Records    []Record
	Unattached []Resolution
}

// ExplainSession reads a session's decisions and resolutions.
func ExplainSession(ctx context.Context, pool *pgxpool.Pool, sessionID string) (Explanation, error) {
	recs, err := Records(ctx, pool, sessionID)
	if err != nil {
		return Explanation{}, err
	}
	res, err := Resolutions(ctx, pool, sessionID)
	if err != nil {
		return Explanation{}, err
	}
	x := Explanation{Records: recs}
	for _, r := range res {
		i := slices.IndexFunc(x.Records, func(rec Record) bool { return rec.ExecutionID == r.ExecutionID })
		if i < 0 {
			x.Unattached = append(x.Unattached, r)
			continue
		}
		x.Records[i].Resolutions = append(x.Records[i].Resolutions, r)
	}
	return x, nil
}

// Explain writes the decisions in words, for operators, and the
// operators' resolutions with them (resolutions, when given, are those of
// executions without a decision).
func Explain(w io.Writer, records []Record, resolutions ...Resolution) {
	defer explainResolutions(w, "Resolution of a turn no recovery decided", resolutions)
	if len(records) == 0 {
		fmt.Fprintln(w, "No recovery decisions for this session.")
		return
	}
	for _, r := range records {
		fmt.Fprintf(w, "%s  execution %s (owner %s) expired at %s in phase %q.\n",
			r.DecidedAt.UTC().Format(time.RFC3339), r.ExecutionID, r.Evidence.Owner,
			r.Evidence.expiredAtText(), r.PhaseFound)
		fmt.Fprintf(w, "  Decision: %s — %s\n", r.Decision, because(r))
		if r.Decision != DecisionQuarantined {
			fmt.Fprintf(w, "  Fencing token %d → %d: the old execution can write nothing more.\n", r.TokenBefore, r.TokenAfter)
		}
		explainEvidence(w, r.Evidence)
		if r.ContinuationID != "" {
			state := "not yet promoted"
			if r.SettledAt != nil {
				state = "promoted at " + r.SettledAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "  Continuation input %s: %s.\n", r.ContinuationID, state)
		}
		explainResolutions(w, "  Resolved", r.Resolutions)
	}
}

// explainEvidence writes what a decision rests on.
func explainEvidence(w io.Writer, ev Evidence) {
	for _, a := range ev.Attempts {
		fmt.Fprintf(w, "  Provider attempt %s (step %d, %s) was %s.\n", a.ID, a.Step, a.Provider, a.State)
		if a.Model != "" || a.RequestTokens > 0 || a.ResponseID != "" {
			fmt.Fprintf(w, "    model %s, about %d input tokens, provider response ID %s.\n",
				cmp.Or(a.Model, "-"), a.RequestTokens, cmp.Or(a.ResponseID, "none received"))
		}
	}
	for _, c := range ev.ToolCalls {
		fmt.Fprintf(w, "  Tool call %s (%s, %s) was %s.\n", c.ID, c.Tool, c.Class, c.State)
	}
	if ev.AssistantMessageID != "" {
		fmt.Fprintf(w, "  Its assistant message %s was %s; the session's newest is %s.\n",
			ev.AssistantMessageID, ev.AssistantStatus, ev.NewestAssistantID)
		if ev.SupersededBy != "" {
			fmt.Fprintf(w, "  Assistant message %s superseded it (a newer turn, or its turn gone on past it).\n", ev.SupersededBy)
		}
	}
	fmt.Fprintf(w, "  Inputs waiting: %d.\n", ev.WaitingInputs)
	if c := ev.Cap; c != nil {
		since := ""
		if c.ReleasedAt != nil {
			since = ", since the release at " + c.ReleasedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "  Recoveries that ran the session's turn again within %s%s: %d (cap %d).\n", c.Window, since, c.Recovered, c.Max)
	}
}

// explainResolutions writes who resolved what, and what it led to.
func explainResolutions(w io.Writer, lead string, rs []Resolution) {
	indent := lead[:len(lead)-len(strings.TrimLeft(lead, " "))]
	for _, r := range rs {
		finding := "it ran"
		switch {
		case r.Finding == FindingDidNotRun && r.TargetKind == "attempt":
			finding = "it was not acted on; the continuation sends its step again"
		case r.Finding == FindingDidNotRun:
			finding = "it did not run; the continuation runs it"
		case r.TargetKind == "attempt":
			finding = "it was acted on; its answer is lost, so the turn does not go on"
		case r.Output != "":
			finding = "it ran; the model is handed the output " + strconv.Quote(r.Output)
		}
		who := r.ResolvedBy
		if r.Note != "" {
			who += " (" + strconv.Quote(r.Note) + ")"
		}
		fmt.Fprintf(w, "%s: %s %s (was %s) at %s by %s: %s.\n", lead, strings.ReplaceAll(r.TargetKind, "_", " "), r.TargetID,
			r.StateBefore, r.ResolvedAt.UTC().Format(time.RFC3339), who, finding)
		if r.ContinuationID != "" {
			state := "not yet promoted"
			if r.SettledAt != nil {
				state = "promoted at " + r.SettledAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s  Continuation input %s: %s.\n", indent, r.ContinuationID, state)
		}
	}
}

func because(r Record) string {
	switch r.Decision {
	case DecisionCleared:
		return "the turn had completed; the claim was cleared" + wake(r)
	case DecisionSuperseded:
		return "a newer turn had superseded its turn (its assistant message was no longer the session's newest); the claim was cleared without continuing" + wake(r)
	case DecisionRewoken:
		return "nothing uncertain had been dispatched; the claim was cleared" + wake(r)
	case DecisionContinued:
		switch r.Rule {
		case RuleIdempotentToolRetry:
			return "a started tool call was idempotent, so it runs again with its idempotency key; the turn continues"
		case RuleIdempotentProviderRetry:
			return "the started (or failed and waiting for its retry) provider attempt goes to a provider that honours idempotency keys, so it is sent again with its key; the turn continues"
		}
		return "the step had ended durably (settled tool results); one continuation turn was admitted"
	case DecisionReconciled:
		return "a provider request or a side-effecting tool call may have been acted on and its outcome was never recorded; it was marked unknown, the turn failed with reason outcome_unknown, and nothing was replayed" + wake(r)
	case DecisionQuarantined:
		if strings.HasPrefix(r.QuarantineReason, ReasonRecoveryCap) {
			return "the session reached its recovery cap (" + r.QuarantineReason + "), so the turn is not run again; it is held until an operator looks and releases it (consumer quarantine release), after which the count starts afresh"
		}
		return "the row failed validation: " + r.QuarantineReason + "; it is skipped until an operator repairs and releases it (consumer quarantine release)"
	}
	return strings.TrimSpace(string(r.Decision))
}

func wake(r Record) string {
	if r.Evidence.WaitingInputs > 0 {
		return ", with a wake for the waiting inputs"
	}
	return ""
}
