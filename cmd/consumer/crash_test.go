package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
)

// The crash windows of DESIGN.md, killed with SIGKILL on real processes:
// the consumer kills itself at a crash point (internal/faults), a second
// consumer in the same group takes over and must finish the work without
// repeating it.

const (
	// crashTimeout bounds the wait for a crash point to be reached.
	crashTimeout       = 30 * time.Second
	assistantAnswering = `SELECT count(*) FROM messages WHERE role = 'assistant' AND $1 = ANY(answers)`
)

// TestCrashAfterAdmissionCommit: the admission transaction committed, the
// Kafka offset was not. The prompt is redelivered to the next consumer and
// must be an exact retry: one input, one turn, one answer.
func TestCrashAfterAdmissionCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-admission"
	first, second := prompt(session, "first"), prompt(session, "second")

	crashing := b.start(t, "consumer-1", faults.AdmissionAfterCommit)
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, first.MessageID),
		"the admission committed before the crash")

	b.start(t, "consumer-2", "")
	turn := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, "echo: first", turn.Text)

	// The second prompt sits behind the redelivered first one on the same
	// partition (same key): once its turn is out, the redelivery has been
	// handled.
	b.send(t, second)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, second.MessageID).Type)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, first.MessageID))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1`, session),
		"the redelivery added no input")
	require.Equal(t, 1, b.count(t, assistantAnswering, first.MessageID), "one answer to the first prompt")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, first.MessageID)), "one turn for the first prompt")
	require.Equal(t, 1, distinctIDs(b.events.admittedEvents(t, first.MessageID)), "one admission of the first prompt")
}

// TestCrashAfterRelayPublish: outbox rows published to Kafka, not yet
// marked published. The next relay publishes them again (a duplicate
// input.admitted event, a duplicate wake): harmless, the turn runs once.
func TestCrashAfterRelayPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-relay"
	p := prompt(session, "relayed")

	crashing := b.start(t, "consumer-1", faults.RelayAfterPublish)
	b.send(t, p)
	// The first rows the relay publishes are this prompt's admission rows,
	// so the process must die before the turn ever runs; were the crash
	// point missing, the turn would complete in this process.
	require.Eventually(t, func() bool {
		return !crashing.running() || len(b.events.turnEvents(t, p.MessageID)) > 0
	}, crashTimeout, 20*time.Millisecond, "neither a crash nor a turn")
	require.False(t, crashing.running(),
		"the turn completed and the consumer still runs: the %s crash point was never reached (is faults.Hit(faults.RelayAfterPublish) called between publishing and marking in outbox/relay.go?)",
		faults.RelayAfterPublish)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Positive(t, b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`),
		"the crash left published rows unmarked")
	require.Eventually(t, func() bool { return len(b.events.admittedEvents(t, p.MessageID)) == 1 },
		10*time.Second, 20*time.Millisecond, "the rows were published before the crash")

	b.start(t, "consumer-2", "")
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, "echo: relayed", turn.Text)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, 10*time.Second, 20*time.Millisecond, "the second relay publishes and marks every row")

	require.Equal(t, 1, b.count(t, assistantAnswering, p.MessageID), "one answer")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'completed'`, p.MessageID))
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "one turn")
	admitted := b.events.admittedEvents(t, p.MessageID)
	require.Len(t, admitted, 2, "published before the crash and again after it")
	require.Equal(t, 1, distinctIDs(admitted), "the duplicate carries the same event id")
}

// TestCrashAfterProviderIntent: inputs promoted and the provider attempt's
// intent committed (claim phase unknown), the request not yet sent. After a
// restart nothing replays the attempt: it stays "started", its assistant
// message pending, and the dead consumer's expired claim (phase unknown)
// stays for recovery to reconcile; acquisition never takes over a claim
// (invariant 4). Other sessions run.
func TestCrashAfterProviderIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-intent"
	first := prompt(session, "first")
	other := prompt("s-intent-other", "other")
	lease := []string{"--lease", "1s"}

	crashing := b.start(t, "consumer-1", faults.ProviderAfterIntent, lease...)
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'`, session),
		"the intent was committed before the crash")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'pending'`, first.MessageID))

	b.start(t, "consumer-2", "", lease...)
	b.send(t, first) // a redelivery too: still an exact retry
	b.send(t, other)
	turn := b.events.waitTurn(t, other.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "the restarted consumer runs other sessions")
	// Whenever the first session's redelivered wake arrives, the expired
	// claim makes the restarted consumer drop it: no attempt can follow.
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session),
		"no second provider attempt")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'`, session))
	require.Equal(t, 1, b.count(t, assistantAnswering, first.MessageID), "no second assistant message")
	require.Zero(t, distinctIDs(b.events.turnEvents(t, first.MessageID)), "the turn neither completed nor was replayed")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND phase = 'unknown' AND expires_at <= now()`, session),
		"the expired claim waits for recovery")
}
