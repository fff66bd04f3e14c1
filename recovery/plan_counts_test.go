package recovery_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// A plan's counts are its decisions, one per claim, and its lost wakes as
// redriven; a plan without lost wakes counts no redriven at all (not a
// zero), as a plan without claims counts only its lost wakes.
func TestPlanCounts(t *testing.T) {
	t.Parallel()
	claim := func(d recovery.DecisionKind) recovery.PlannedClaim {
		return recovery.PlannedClaim{Decision: recovery.Decision{Decision: d}}
	}
	for name, tc := range map[string]struct {
		plan recovery.Plan
		want map[recovery.DecisionKind]int
	}{
		"Empty": {want: map[recovery.DecisionKind]int{}},
		"ClaimsOnly": {plan: recovery.Plan{Claims: []recovery.PlannedClaim{claim(recovery.DecisionRewoken), claim(recovery.DecisionReconciled), claim(recovery.DecisionRewoken)}},
			want: map[recovery.DecisionKind]int{recovery.DecisionRewoken: 2, recovery.DecisionReconciled: 1}},
		"LostWakesOnly": {plan: recovery.Plan{LostWakes: []recovery.LostWake{{SessionID: "a"}, {SessionID: "b"}}},
			want: map[recovery.DecisionKind]int{recovery.DecisionRedriven: 2}},
		"Both": {plan: recovery.Plan{Claims: []recovery.PlannedClaim{claim(recovery.DecisionContinued)}, LostWakes: []recovery.LostWake{{SessionID: "a"}}},
			want: map[recovery.DecisionKind]int{recovery.DecisionContinued: 1, recovery.DecisionRedriven: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.plan.Counts())
		})
	}
}

// A written plan says it would do nothing only when it has neither claims
// nor lost wakes; a plan of lost wakes alone lists them.
func TestWritePlanOfLostWakesOnly(t *testing.T) {
	t.Parallel()
	var empty, lost strings.Builder
	recovery.WritePlan(&empty, recovery.Plan{})
	require.Contains(t, empty.String(), "a pass would do nothing")
	recovery.WritePlan(&lost, recovery.Plan{LostWakes: []recovery.LostWake{{SessionID: "a", WaitingInputs: 2, Decision: recovery.DecisionRedriven}}})
	require.NotContains(t, lost.String(), "a pass would do nothing")
	require.Contains(t, lost.String(), "Session a: 2 inputs wait")
	require.Contains(t, lost.String(), "Would decide: redriven")

	var claims strings.Builder
	recovery.WritePlan(&claims, recovery.Plan{Claims: []recovery.PlannedClaim{
		{SessionID: "c", Decision: recovery.Decision{Decision: recovery.DecisionContinued, ContinuationID: "cont-1"}},
		{SessionID: "w", Decision: recovery.Decision{Decision: recovery.DecisionRewoken}},
	}})
	require.Contains(t, claims.String(), "Continuation input cont-1: would be admitted.")
	require.Equal(t, 1, strings.Count(claims.String(), "Continuation input"), "only the claim that has one")
}
