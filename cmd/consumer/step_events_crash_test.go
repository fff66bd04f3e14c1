package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// TestStepEventIDsStableAcrossRecovery: a consumer is killed between an
// idempotent tool call's intent (tool.started committed with it) and its
// result; recovery continues the turn and the call runs again with its key.
// The step events name the same facts with the same IDs on both sides of
// the crash: a consumer that deduplicates on id sees the turn start once,
// the call dispatched twice (each dispatch under its claim's id), one
// tool.completed, and the steps numbered on from the crashed run.
//
// It catches: an event ID drawn from the process, a re-dispatch hidden
// under the crashed run's id, a continuation that numbers its steps
// from 1 again, a turn.recovered missing or written twice, and an event of
// the continuation that names another turn.
func TestStepEventIDsStableAcrossRecovery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-step-events-crash"
	p := prompt(session, `/tool echo {"text":"x"}`)

	crashing := b.start(t, "consumer-1", faults.IdempotentToolAfterIntent, "--lease", "1s")
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	execID, crashedToken, _ := claimOf(t, b, session)
	var callID, turnID string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT c.call_id, m.turn_id FROM tool_calls c
		JOIN attempts a USING (attempt_id) JOIN messages m ON m.message_id = a.assistant_message_id
		WHERE c.session_id = $1 AND c.state = 'started'`, session).Scan(&callID, &turnID))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventToolStarted), "tool.started committed with the intent")
	require.Zero(t, testkit.CountEvents(t, b.pool, session, envelope.EventToolCompleted))

	b.start(t, "consumer-2", "", recoveryFlags...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)

	// Kafka: the first copy of each id, in order.
	var evs []envelope.Event
	require.Eventually(t, func() bool {
		evs = nil
		seen := map[string]bool{}
		for _, e := range b.events.events(t) {
			if e.SessionID == session && !seen[e.ID] {
				seen[e.ID] = true
				evs = append(evs, e)
			}
		}
		return len(evs) == 10
	}, 20*time.Second, 20*time.Millisecond, "distinct events of %s", session)
	byType := map[string][]envelope.Event{}
	for _, e := range evs {
		byType[e.Type] = append(byType[e.Type], e)
	}
	require.Len(t, byType[envelope.EventTurnStarted], 1)
	require.Equal(t, "turn.started:"+turnID, byType[envelope.EventTurnStarted][0].ID)
	// Each dispatch and each outcome is named after the claim that
	// committed it: the crashed run's dispatch, then the continuation's
	// dispatch and outcome.
	var settledBy int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT fencing_token FROM messages WHERE message_id = $1 AND role = 'tool'`,
		callID).Scan(&settledBy))
	require.Greater(t, settledBy, crashedToken)
	require.Len(t, byType[envelope.EventToolStarted], 2, "the re-run is a dispatch of its own")
	require.Equal(t, fmt.Sprintf("tool.started:%s@%d", callID, crashedToken), byType[envelope.EventToolStarted][0].ID)
	require.Equal(t, fmt.Sprintf("tool.started:%s@%d", callID, settledBy), byType[envelope.EventToolStarted][1].ID)
	require.Len(t, byType[envelope.EventToolCompleted], 1)
	require.Equal(t, fmt.Sprintf("tool.completed:%s@%d", callID, settledBy), byType[envelope.EventToolCompleted][0].ID)
	require.Equal(t, "succeeded", byType[envelope.EventToolCompleted][0].Outcome)
	require.Len(t, byType[envelope.EventTurnRecovered], 1)
	rec := byType[envelope.EventTurnRecovered][0]
	require.Equal(t, "turn.recovered:"+execID, rec.ID)
	require.Equal(t, recovery.ContinuationID(execID), rec.ContinuationMessageID)
	require.Equal(t, recovery.RuleIdempotentToolRetry, rec.Rule)
	require.Equal(t, []string{p.MessageID}, rec.MessageIDs)
	steps := byType[envelope.EventStepCompleted]
	require.Len(t, steps, 2)
	require.Equal(t, 1, steps[0].Step)
	require.Equal(t, 2, steps[1].Step, "the continuation numbers its step on")
	require.Equal(t, turn.AssistantMessageID, steps[1].AssistantMessageID)
	for _, e := range evs[1:] {
		if e.Type != envelope.EventRecoveryDecided && e.Type != envelope.EventTurnCompleted {
			require.Equal(t, turnID, e.TurnID, "%s names its turn", e.ID)
		}
	}

	// The outbox: the re-run wrote tool.started again (its own id), every
	// other step event once.
	require.Equal(t, 2, testkit.CountEvents(t, b.pool, session, envelope.EventToolStarted))
	for _, typ := range []string{envelope.EventTurnStarted, envelope.EventToolCompleted, envelope.EventTurnRecovered} {
		require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, typ), typ)
	}
	require.Equal(t, 2, testkit.CountEvents(t, b.pool, session, envelope.EventStepCompleted))
}
