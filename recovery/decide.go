package recovery

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/promptline/promptline/ledger"
)

// DecisionKind names what recovery decided for a claim. Its values are
// public: the decision label of the metrics, the recoveries table, the
// events and the commands' output carry them as they are.
type DecisionKind string

// Decisions.
const (
	DecisionCleared     DecisionKind = "cleared"
	DecisionSuperseded  DecisionKind = "superseded"
	DecisionRewoken     DecisionKind = "rewoken"
	DecisionContinued   DecisionKind = "continued"
	DecisionReconciled  DecisionKind = "reconciled"
	DecisionQuarantined DecisionKind = "quarantined"
)

// Decisions lists the decisions above.
var Decisions = []DecisionKind{
	DecisionCleared, DecisionSuperseded, DecisionRewoken, DecisionContinued, DecisionReconciled, DecisionQuarantined,
}

// Rules: exceptions to "never replay an uncertain call".
const (
	RuleIdempotentToolRetry     = "idempotent_tool_retry"
	RuleIdempotentProviderRetry = "idempotent_provider_retry"
)

// ContinuationID is the deterministic continuation input of an execution.
var ContinuationID = ledger.ContinuationID

// ContinuationTakenID is the continuation input's ID when a prompt holds
// ContinuationID: "recovery-continue <execution ID>", which no prompt can
// hold (a prompt's message ID has no space, envelope.Decode).
func ContinuationTakenID(executionID string) string { return "recovery-continue " + executionID }

// ReasonExpiryNotFinite begins the quarantine reason of a claim whose
// expires_at is '-infinity' or 'infinity' (ledger.Claim.ExpiresNotFinite),
// followed by the value in parentheses.
const ReasonExpiryNotFinite = "expires_at is not finite"

// ReasonTranscriptUnreadable begins the quarantine reason of a claim whose
// session's transcript cannot be read back (Evidence.TranscriptUnreadable),
// followed by the part and why.
const ReasonTranscriptUnreadable = "transcript unreadable"

// validate returns why a claim cannot be decided on, or "".
func validate(c ledger.Claim, ev Evidence) string {
	if c.ExpiresNotFinite != "" {
		// No writer sets one (a lease is the clock plus a duration,
		// invariant 5): the row was edited, restored or repaired outside
		// promptline, so it is not what an executor left, and 'infinity'
		// would hold its session for good. An operator sets a time.
		return ReasonExpiryNotFinite + " (" + c.ExpiresNotFinite + ")"
	}
	switch c.Phase {
	case ledger.PhaseReady, ledger.PhaseUnknown, ledger.PhaseContinue, ledger.PhaseSafe:
	default:
		return fmt.Sprintf("unknown phase %q", c.Phase)
	}
	if c.AssistantMessageID != "" && ev.AssistantStatus == "" {
		return fmt.Sprintf("claim points at missing assistant message %s", c.AssistantMessageID)
	}
	if c.Phase == ledger.PhaseContinue && c.AssistantMessageID == "" {
		return "phase continue without an assistant message"
	}
	if ev.TranscriptUnreadable != "" {
		// Every provider step sends the session's history, and the
		// executor sends none it cannot read whole (a request without a
		// call could have the model make it again): continued, re-woken
		// or woken, the session would fail again at every lease, and
		// nothing would say so (invariant 13). Held here, it is counted
		// and alerted on; once an operator repaired the part and released
		// the claim, it is decided by its phase.
		return ReasonTranscriptUnreadable + ": " + ev.TranscriptUnreadable
	}
	return ""
}

// Decision is what recovery decides for one expired claim: a pure function
// of the claim and its evidence (Decide), so that a plan (Plan) and a pass
// take the same decision on the same evidence.
type Decision struct {
	Decision DecisionKind `json:"decision"`
	Rule     string       `json:"rule,omitempty"`
	// ContinuationID is the continuation input a continued decision admits.
	ContinuationID string `json:"continuation_message_id,omitempty"`
	// RetryAttemptID is the attempt sent again with its idempotency key.
	RetryAttemptID   string `json:"retry_attempt_id,omitempty"`
	QuarantineReason string `json:"quarantine_reason,omitempty"`

	retryDeferred bool // RetryAttemptID was deferred (retry_wait), not started
	failed        bool // quarantined because the decision cannot be carried out
	capped        bool // quarantined because the session reached its cap (ev.Cap)
}

// Decide decides for an expired claim on its evidence, reading and writing
// nothing: idempotentProviders name the providers that honour idempotency
// keys (Config.IdempotentProviders).
func Decide(old ledger.Claim, ev Evidence, idempotentProviders []string) Decision {
	if reason := validate(old, ev); reason != "" {
		return Decision{Decision: DecisionQuarantined, QuarantineReason: reason}
	}
	d := Decision{}
	// Superseded by a newer turn, not by the errored rest of its own: a
	// continuation that dies before it begins a step of its own still
	// points at the turn's message, after the errored message of the
	// turn's earlier failure (failedMessage); its started calls must be
	// reconciled like the first failure's.
	superseded := old.AssistantMessageID != "" && ev.SupersededBy != ""
	switch {
	case superseded:
		d.Decision = DecisionSuperseded
	case old.Phase == ledger.PhaseSafe:
		d.Decision = DecisionCleared
	case old.Phase == ledger.PhaseReady:
		d.Decision = DecisionRewoken
	case old.Phase == ledger.PhaseContinue:
		d.Decision = DecisionContinued
		d.Rule, d.RetryAttemptID, d.retryDeferred = continueRule(ev, idempotentProviders)
	case old.Phase == ledger.PhaseUnknown:
		d = unknownRule(ev, idempotentProviders)
	}
	if d.Decision == DecisionContinued {
		id, reason := continuationID(old, ev)
		if reason != "" {
			// The decision cannot be carried out: a failed decision,
			// quarantined (invariant 10), as before it was decided here.
			return Decision{Decision: DecisionQuarantined, QuarantineReason: "decision failed: " + reason, failed: true}
		}
		d.ContinuationID = id
	}
	if (d.Decision == DecisionContinued || d.Decision == DecisionRewoken) && ev.Cap.reached() {
		// It would run the turn again: once too often (Config.MaxPerSession).
		return Decision{Decision: DecisionQuarantined, capped: true, QuarantineReason: fmt.Sprintf(
			"%s: the session's turns were run again by recovery %d times within %s (cap %d); this %s is not carried out",
			ReasonRecoveryCap, ev.Cap.Recovered, ev.Cap.Window, ev.Cap.Max, d.Decision)}
	}
	return d
}

// continuationHash is the payload hash of an execution's continuation input.
func continuationHash(old ledger.Claim) []byte {
	h := sha256.Sum256([]byte("continuation:" + old.SessionID + ":" + old.ExecutionID))
	return h[:]
}

// continuationID picks the continuation input's ID from the inputs that
// hold its candidates: ContinuationID, or ContinuationTakenID when a prompt
// holds that one (a message ID is the sender's to choose; what an input is
// says its kind, docs/design.md, invariant 14). An ID held by this very
// continuation is taken again (an exact retry); one held by an input of
// another session, kind or payload never is. reason says why none fits.
func continuationID(old ledger.Claim, ev Evidence) (id, reason string) {
	h := continuationHash(old)
	for _, id := range []string{ContinuationID(old.ExecutionID), ContinuationTakenID(old.ExecutionID)} {
		i := slices.IndexFunc(ev.ContinuationHolders, func(in InputFact) bool { return in.MessageID == id })
		if i < 0 {
			return id, ""
		}
		in := ev.ContinuationHolders[i]
		if in.Kind == "continuation" && in.SessionID == old.SessionID && bytes.Equal(in.PayloadHash, h) {
			return id, ""
		}
		if in.Kind == "continuation" && in.SessionID != old.SessionID {
			return "", fmt.Sprintf("continuation input %s belongs to session %s, not %s", id, in.SessionID, old.SessionID)
		}
	}
	return "", fmt.Sprintf("continuation input of %s: both IDs are held by other inputs", old.ExecutionID)
}

// continueRule decides for phase continue: an attempt deferred for a
// retry to a provider that honours idempotency keys is sent again with its
// key. Its failure may have been an answer after acting on the step (a
// 500, with such a provider, is retried): a fresh key would let the
// provider act twice. Other deferred attempts were certainly not acted on
// (ErrNotSent, a 429 or 503 refusal) and are sent afresh.
func continueRule(ev Evidence, idempotentProviders []string) (rule, attemptID string, deferred bool) {
	for _, a := range ev.Attempts {
		if a.State == ledger.AttemptRetryWait && slices.Contains(idempotentProviders, a.Provider) {
			return RuleIdempotentProviderRetry, a.ID, true
		}
	}
	return "", "", false
}

// unknownRule decides for phase unknown: reconcile, unless the only
// uncertain thing may be repeated with its idempotency key: the decision,
// its rule and the attempt it sends again, if any.
func unknownRule(ev Evidence, idempotentProviders []string) Decision {
	var startedAttempts []AttemptFact
	for _, a := range ev.Attempts {
		if a.State == ledger.AttemptStarted {
			startedAttempts = append(startedAttempts, a)
		}
	}
	var startedIdem, startedSide int
	for _, c := range ev.ToolCalls {
		if c.State == ledger.CallStarted {
			if c.Class == "idempotent" {
				startedIdem++
			} else {
				startedSide++
			}
		}
	}
	switch {
	case startedSide > 0:
	case len(startedAttempts) == 1 && startedIdem == 0 && slices.Contains(idempotentProviders, startedAttempts[0].Provider):
		return Decision{Decision: DecisionContinued, Rule: RuleIdempotentProviderRetry, RetryAttemptID: startedAttempts[0].ID}
	case len(startedAttempts) == 0 && startedIdem > 0:
		return Decision{Decision: DecisionContinued, Rule: RuleIdempotentToolRetry}
	}
	return Decision{Decision: DecisionReconciled}
}
