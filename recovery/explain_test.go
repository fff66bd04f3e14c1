package recovery_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// Every decision kind reads as a sentence an operator can act on.
func TestExplainEachDecision(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := recovery.Record{ExecutionID: "e1", SessionID: "s", TokenBefore: 3, TokenAfter: 4, DecidedAt: pgdb.TimeOf(at),
		Evidence: recovery.Evidence{Owner: "consumer-a", ExpiredAt: at, WaitingInputs: 1,
			AssistantMessageID: "a1", AssistantStatus: "pending", NewestAssistantID: "a1",
			Attempts:  []recovery.AttemptFact{{ID: "e1/step-1", Step: 1, Provider: "http", State: "started"}},
			ToolCalls: []recovery.ToolCallFact{{ID: "e1/step-1/call-0", Tool: "append_line", Class: "side_effecting", State: "started"}}}}
	cases := map[string]struct {
		decision                              recovery.DecisionKind
		rule, phase, continuation, quarantine string
		want                                  []string
	}{
		"cleared":    {decision: recovery.DecisionCleared, phase: "safe", want: []string{"the turn had completed", "with a wake for the waiting inputs"}},
		"superseded": {decision: recovery.DecisionSuperseded, phase: "continue", want: []string{"no longer the session's newest"}},
		"rewoken":    {decision: recovery.DecisionRewoken, phase: "ready", want: []string{"nothing uncertain had been dispatched"}},
		"continued": {decision: recovery.DecisionContinued, phase: "continue", continuation: "recovery-continue-e1",
			want: []string{"one continuation turn was admitted", "Continuation input recovery-continue-e1: not yet promoted"}},
		"idempotent tool": {decision: recovery.DecisionContinued, rule: recovery.RuleIdempotentToolRetry, phase: "unknown",
			want: []string{"runs again with its idempotency key"}},
		"idempotent provider": {decision: recovery.DecisionContinued, rule: recovery.RuleIdempotentProviderRetry, phase: "unknown",
			want: []string{"sent again with its key"}},
		"reconciled": {decision: recovery.DecisionReconciled, phase: "unknown",
			want: []string{"outcome_unknown", "nothing was replayed", "Tool call e1/step-1/call-0 (append_line, side_effecting) was started"}},
		"quarantined": {decision: recovery.DecisionQuarantined, phase: "bogus", quarantine: `unknown phase "bogus"`,
			want: []string{`failed validation: unknown phase "bogus"`, "consumer quarantine release"}},
	}
	for name, c := range cases {
		r := base
		r.Decision, r.Rule, r.PhaseFound, r.ContinuationID, r.QuarantineReason = c.decision, c.rule, c.phase, c.continuation, c.quarantine
		var out bytes.Buffer
		recovery.Explain(&out, []recovery.Record{r})
		text := out.String()
		require.Contains(t, text, "execution e1 (owner consumer-a) expired at 2026-01-02T03:04:05Z in phase \""+c.phase+"\"", name)
		require.Contains(t, text, "Decision: "+string(c.decision), name)
		for _, w := range c.want {
			require.Contains(t, text, w, name)
		}
		if c.decision == recovery.DecisionQuarantined {
			require.NotContains(t, text, "Fencing token", "%s: a quarantined claim was not taken over", name)
		} else {
			require.Contains(t, text, "Fencing token 3 → 4", name)
		}
	}
}

// What a record without an assistant message, or without waiting inputs,
// does not say.
func TestExplainLeavesOutWhatIsNotThere(t *testing.T) {
	t.Parallel()
	r := recovery.Record{ExecutionID: "e1", SessionID: "s", TokenBefore: 1, TokenAfter: 2, Decision: recovery.DecisionRewoken,
		PhaseFound: "ready", Evidence: recovery.Evidence{Owner: "consumer-a"}}
	var out bytes.Buffer
	recovery.Explain(&out, []recovery.Record{r})
	require.NotContains(t, out.String(), "assistant message")
	require.NotContains(t, out.String(), "waiting inputs")

	r.Evidence.WaitingInputs, r.Evidence.AssistantMessageID, r.Evidence.AssistantStatus = 1, "a1", "pending"
	out.Reset()
	recovery.Explain(&out, []recovery.Record{r})
	require.Contains(t, out.String(), "Its assistant message a1 was pending")
	require.Contains(t, out.String(), "with a wake for the waiting inputs")
}

// An attempt's spend evidence (model, estimate, response ID) is said when
// recorded, and its absence is said for an attempt with a model but no ID.
func TestExplainSaysTheSpendAtRisk(t *testing.T) {
	t.Parallel()
	r := recovery.Record{ExecutionID: "e1", SessionID: "s", TokenBefore: 1, TokenAfter: 2, Decision: recovery.DecisionReconciled,
		PhaseFound: "unknown", Evidence: recovery.Evidence{Owner: "consumer-a", Attempts: []recovery.AttemptFact{
			{ID: "e1/step-1", Step: 1, Provider: "openai", State: "started", Model: "gpt-x", RequestTokens: 1234, ResponseID: "req-7"},
			{ID: "e1/step-2", Step: 2, Provider: "openai", State: "started", Model: "gpt-x", RequestTokens: 99},
			{ID: "e1/step-3", Step: 3, Provider: "old", State: "started"},
			{ID: "e1/step-4", Step: 4, Provider: "p", State: "started", ResponseID: "req-9"},
		}}}
	var out bytes.Buffer
	recovery.Explain(&out, []recovery.Record{r})
	text := out.String()
	require.Contains(t, text, "Provider attempt e1/step-1 (step 1, openai) was started.\n    model gpt-x, about 1234 input tokens, provider response ID req-7.\n")
	require.Contains(t, text, "Provider attempt e1/step-2 (step 2, openai) was started.\n    model gpt-x, about 99 input tokens, provider response ID none received.\n")
	require.Contains(t, text, "Provider attempt e1/step-3 (step 3, old) was started.\n  Provider attempt e1/step-4",
		"an attempt recorded before the spend columns says nothing more")
	require.Contains(t, text, "Provider attempt e1/step-4 (step 4, p) was started.\n    model -, about 0 input tokens, provider response ID req-9.\n",
		"a response ID alone is said")
}
