package recovery_test

import (
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// Decide reads and writes nothing: the decision is a function of the claim
// and its evidence, so a plan and a pass agree on the same evidence.
func TestDecide(t *testing.T) {
	t.Parallel()
	claim := func(phase ledger.Phase, asst string) ledger.Claim {
		return ledger.Claim{SessionID: "s", ExecutionID: "e", Phase: phase, AssistantMessageID: asst}
	}
	for name, tc := range map[string]struct {
		claim      ledger.Claim
		ev         recovery.Evidence
		idempotent []string
		want       recovery.Decision
	}{
		"Ready":      {claim: claim(ledger.PhaseReady, ""), want: recovery.Decision{Decision: recovery.DecisionRewoken}},
		"Safe":       {claim: claim(ledger.PhaseSafe, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a"}, want: recovery.Decision{Decision: recovery.DecisionCleared}},
		"Superseded": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "b", SupersededBy: "b"}, want: recovery.Decision{Decision: recovery.DecisionSuperseded}},
		"Continue": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a"},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: recovery.ContinuationID("e")}},
		"ContinueIDHeldByAPrompt": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			ContinuationHolders: []recovery.InputFact{{MessageID: recovery.ContinuationID("e"), SessionID: "s", Kind: "prompt"}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: recovery.ContinuationTakenID("e")}},
		"ContinueIDHeldByAnotherSession": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			ContinuationHolders: []recovery.InputFact{{MessageID: recovery.ContinuationID("e"), SessionID: "x", Kind: "continuation"}}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "decision failed: continuation input " + recovery.ContinuationID("e") + " belongs to session x, not s"}},
		"UnknownReconciled": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownIdempotentProvider": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, Rule: recovery.RuleIdempotentProviderRetry, RetryAttemptID: "at", ContinuationID: recovery.ContinuationID("e")}},
		"CapReachedRewoken": {claim: claim(ledger.PhaseReady, ""), ev: recovery.Evidence{Cap: &recovery.CapFact{Max: 2, Window: "1h0m0s", Recovered: 2}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "recovery_cap: the session's turns were run again by recovery 2 times within 1h0m0s (cap 2); this rewoken is not carried out"}},
		"CapReachedContinued": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a", Cap: &recovery.CapFact{Max: 2, Window: "1h0m0s", Recovered: 3}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "recovery_cap: the session's turns were run again by recovery 3 times within 1h0m0s (cap 2); this continued is not carried out"}},
		"CapReachedIdempotentRetry": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}}, Cap: &recovery.CapFact{Max: 1, Window: "1h0m0s", Recovered: 1}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "recovery_cap: the session's turns were run again by recovery 1 times within 1h0m0s (cap 1); this continued is not carried out"}},
		"CapNotReached": {claim: claim(ledger.PhaseReady, ""), ev: recovery.Evidence{Cap: &recovery.CapFact{Max: 2, Window: "1h0m0s", Recovered: 1}},
			want: recovery.Decision{Decision: recovery.DecisionRewoken}},
		"CapDisabled": {claim: claim(ledger.PhaseReady, ""), ev: recovery.Evidence{Cap: &recovery.CapFact{Max: 0, Window: "1h0m0s", Recovered: 9}},
			want: recovery.Decision{Decision: recovery.DecisionRewoken}},
		// Decisions that do not run the turn again are never capped: the
		// cap is for loops, and these end them.
		"CapReachedReconciled": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}}, Cap: &recovery.CapFact{Max: 1, Window: "1h0m0s", Recovered: 5}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"CapReachedCleared": {claim: claim(ledger.PhaseSafe, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a", Cap: &recovery.CapFact{Max: 1, Recovered: 5}},
			want: recovery.Decision{Decision: recovery.DecisionCleared}},
		"CapReachedSuperseded": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "b", SupersededBy: "b", Cap: &recovery.CapFact{Max: 1, Recovered: 5}},
			want: recovery.Decision{Decision: recovery.DecisionSuperseded}},
		// Phase continue: a deferred retry to a provider that honours keys
		// is sent again with its key; any other deferred attempt afresh.
		"ContinueDeferredIdempotentProvider": {claim: claim(ledger.PhaseContinue, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at1", Provider: "p", State: ledger.AttemptSucceeded}, {ID: "at2", Provider: "p", State: ledger.AttemptRetryWait}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, Rule: recovery.RuleIdempotentProviderRetry, RetryAttemptID: "at2", ContinuationID: recovery.ContinuationID("e")}},
		"ContinueDeferredOtherProvider": {claim: claim(ledger.PhaseContinue, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at", Provider: "q", State: ledger.AttemptRetryWait}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: recovery.ContinuationID("e")}},
		// A transcript that cannot be read holds the claim in every phase,
		// superseded or capped: no decision runs the session on it.
		"TranscriptUnreadableContinue": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a", TranscriptUnreadable: "message a part 1: bad"},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "transcript unreadable: message a part 1: bad"}},
		"TranscriptUnreadableReady": {claim: claim(ledger.PhaseReady, ""), ev: recovery.Evidence{TranscriptUnreadable: "message a part 1: bad", Cap: &recovery.CapFact{Max: 1, Recovered: 5}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "transcript unreadable: message a part 1: bad"}},
		"TranscriptUnreadableSuperseded": {claim: claim(ledger.PhaseSafe, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "b", SupersededBy: "b", TranscriptUnreadable: "message b part 1: bad"},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "transcript unreadable: message b part 1: bad"}},
		"ContinueWithoutAssistant": {claim: claim(ledger.PhaseContinue, ""),
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "phase continue without an assistant message"}},
		// The continuation's ID: an exact retry takes its own ID again;
		// a continuation of this session with another payload, like a
		// prompt, moves it to the other ID; with both held, none fits.
		"ContinueIDHeldByItself": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			ContinuationHolders: []recovery.InputFact{{MessageID: recovery.ContinuationID("e"), SessionID: "s", Kind: "continuation", PayloadHash: continuationHash("s", "e")}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: recovery.ContinuationID("e")}},
		"ContinueIDHeldByAnotherPayload": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			ContinuationHolders: []recovery.InputFact{{MessageID: recovery.ContinuationID("e"), SessionID: "s", Kind: "continuation", PayloadHash: continuationHash("s", "other")}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: recovery.ContinuationTakenID("e")}},
		"ContinueBothIDsHeld": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "a",
			ContinuationHolders: []recovery.InputFact{{MessageID: recovery.ContinuationID("e"), SessionID: "s", Kind: "prompt"}, {MessageID: recovery.ContinuationTakenID("e"), SessionID: "s", Kind: "prompt"}}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "decision failed: continuation input of e: both IDs are held by other inputs"}},
		// Phase unknown: reconcile, unless the only uncertain thing is one
		// started attempt to a provider that honours keys, or started
		// idempotent calls and no started attempt.
		"UnknownNothingStarted": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts:  []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptRetryWait}},
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "idempotent", State: ledger.CallRequested}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownIdempotentCalls": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			ToolCalls: []recovery.ToolCallFact{{ID: "c1", Class: "idempotent", State: ledger.CallStarted}, {ID: "c2", Class: "side_effecting", State: ledger.CallRequested}}},
			want: recovery.Decision{Decision: recovery.DecisionContinued, Rule: recovery.RuleIdempotentToolRetry, ContinuationID: recovery.ContinuationID("e")}},
		"UnknownSideEffectingCall": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			ToolCalls: []recovery.ToolCallFact{{ID: "c1", Class: "idempotent", State: ledger.CallStarted}, {ID: "c2", Class: "side_effecting", State: ledger.CallStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownIdempotentProviderAndSideEffectingCall": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts:  []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}},
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "side_effecting", State: ledger.CallStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownIdempotentProviderAndIdempotentCall": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts:  []recovery.AttemptFact{{ID: "at", Provider: "p", State: ledger.AttemptStarted}},
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "idempotent", State: ledger.CallStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownTwoStartedAttempts": {claim: claim(ledger.PhaseUnknown, "a"), idempotent: []string{"p"}, ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			Attempts: []recovery.AttemptFact{{ID: "at1", Provider: "p", State: ledger.AttemptStarted}, {ID: "at2", Provider: "p", State: ledger.AttemptStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"UnknownWithoutAssistant": {claim: claim(ledger.PhaseUnknown, ""), ev: recovery.Evidence{NewestAssistantID: "b", SupersededBy: "b"},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		// Superseded comes first: whatever the phase, a turn that is no
		// longer the session's newest is not run again nor reconciled.
		"SupersededUnknown": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "b", SupersededBy: "b",
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "side_effecting", State: ledger.CallStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionSuperseded}},
		// Newer only by the errored rest of its own turn (a failure of
		// the turn before): decided by its phase, as the first failure was.
		"ErroredRestOfItsTurnUnknown": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "errored", NewestAssistantID: "b",
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "side_effecting", State: ledger.CallStarted}}},
			want: recovery.Decision{Decision: recovery.DecisionReconciled}},
		"ErroredRestOfItsTurnContinue": {claim: claim(ledger.PhaseContinue, "a"), ev: recovery.Evidence{AssistantStatus: "errored", NewestAssistantID: "b"},
			want: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: "recovery-continue-e"}},
		"SupersededSafe": {claim: claim(ledger.PhaseSafe, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "b", SupersededBy: "b"},
			want: recovery.Decision{Decision: recovery.DecisionSuperseded}},
		"SupersededReady": {claim: claim(ledger.PhaseReady, "a"), ev: recovery.Evidence{AssistantStatus: "completed", NewestAssistantID: "b", SupersededBy: "b"},
			want: recovery.Decision{Decision: recovery.DecisionSuperseded}},
		"CapReachedIdempotentCalls": {claim: claim(ledger.PhaseUnknown, "a"), ev: recovery.Evidence{AssistantStatus: "pending", NewestAssistantID: "a",
			ToolCalls: []recovery.ToolCallFact{{ID: "c", Class: "idempotent", State: ledger.CallStarted}}, Cap: &recovery.CapFact{Max: 1, Window: "1h0m0s", Recovered: 1}},
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "recovery_cap: the session's turns were run again by recovery 1 times within 1h0m0s (cap 1); this continued is not carried out"}},
		"UnknownPhase": {claim: claim("bogus", ""), want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: `unknown phase "bogus"`}},
		"MissingAssistant": {claim: claim(ledger.PhaseReady, "gone"),
			want: recovery.Decision{Decision: recovery.DecisionQuarantined, QuarantineReason: "claim points at missing assistant message gone"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := recovery.Decide(tc.claim, tc.ev, tc.idempotent)
			require.Equal(t, tc.want.Decision, got.Decision)
			require.Equal(t, tc.want.Rule, got.Rule)
			require.Equal(t, tc.want.ContinuationID, got.ContinuationID)
			require.Equal(t, tc.want.RetryAttemptID, got.RetryAttemptID)
			require.Equal(t, tc.want.QuarantineReason, got.QuarantineReason)
		})
	}
}

// continuationHash is the payload hash recovery gives an execution's
// continuation input, written out here so that the test pins it.
func continuationHash(sessionID, executionID string) []byte {
	h := sha256.Sum256([]byte("continuation:" + sessionID + ":" + executionID))
	return h[:]
}
