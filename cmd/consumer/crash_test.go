package main

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
)

// The crash windows of docs/design.md, killed with SIGKILL on real processes:
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
//
// The process stops at the crash point for 1s, five times Sarama's offset
// auto-commit interval, before it dies: had the offset been marked before
// the admission committed, it would be committed by then, and the
// redelivery (counted as a duplicate admission by the next consumer) would
// never happen. So the test checks the group's committed offset after the
// kill and the redelivery itself, not only counts that the message ID's
// primary key guarantees anyway.
func TestCrashAfterAdmissionCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-admission"
	first, second := prompt(session, "first"), prompt(session, "second")

	crashing := b.start(t, "consumer-1", faults.AdmissionAfterCommit+"@1s")
	v, err := envelope.Marshal(first)
	require.NoError(t, err)
	partition, offset, err := b.producer.SendMessage(&sarama.ProducerMessage{
		Topic: "prompts", Key: sarama.StringEncoder(session), Value: sarama.ByteEncoder(v),
	})
	require.NoError(t, err)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, first.MessageID),
		"the admission committed before the crash")
	committed := b.committedOffset(t, "prompts", partition)
	require.LessOrEqual(t, committed, offset,
		"the group's committed offset (%d) moved past the prompt (offset %d) although the process died right after its admission committed, before marking it", committed, offset)

	redelivered := b.startConsumer(t, "consumer-2")
	turn := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, "echo: first", turn.Text)
	waitUntil(t, 30*time.Second, "the prompt is redelivered to consumer-2, an exact retry", func() bool {
		return redelivered.metric(t, "promptline_admissions_total", `outcome="duplicate"`) == 1
	})

	// The second prompt sits behind the redelivered first one on the same
	// partition (same key): once its turn is out, the redelivery has been
	// handled.
	b.send(t, second)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, second.MessageID).Type)
	require.Equal(t, 1.0, redelivered.metric(t, "promptline_admissions_total", `outcome="admitted"`), "only the second prompt is new")

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, first.MessageID))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1`, session),
		"the redelivery added no input")
	require.Equal(t, 1, b.count(t, assistantAnswering, first.MessageID), "one answer to the first prompt")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, first.MessageID)), "one turn for the first prompt")
	require.Equal(t, 1, distinctIDs(b.events.admittedEvents(t, first.MessageID)), "one admission of the first prompt")
}

// committedOffset reads the bundle's group's committed offset of a
// partition (-1: none).
func (b *testBundle) committedOffset(t *testing.T, topic string, partition int32) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin([]string{b.addr}, kafkautil.NewConfig("test-admin"))
	require.NoError(t, err)
	defer func() { require.NoError(t, admin.Close()) }()
	res, err := admin.ListConsumerGroupOffsets(b.group, map[string][]int32{topic: {partition}})
	require.NoError(t, err)
	block := res.GetBlock(topic, partition)
	require.NotNil(t, block, "no offset block for %s/%d", topic, partition)
	require.Equal(t, sarama.ErrNoError, block.Err, "offset of %s/%d", topic, partition)
	return block.Offset
}

// TestCrashAfterRelayPublish: outbox rows published to Kafka, not yet
// marked published. The next relay publishes them again (a duplicate
// input.admitted event, a duplicate wake): harmless, the turn runs once.
func TestCrashAfterRelayPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-relay"
	p := prompt(session, "relayed")

	// Without local wakes: the prompt waits for its wake, so the first rows
	// the relay publishes are this prompt's admission rows and the process
	// must die before the turn ever runs; were the crash point missing, the
	// turn would complete in this process. (With a local wake the turn
	// could already be in flight when the relay dies: then its claim's
	// phase decides, as in the executor's crash windows below.)
	crashing := b.start(t, "consumer-1", faults.RelayAfterPublish, "--local-wakes=false")
	b.send(t, p)
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
// restart and a recovery pass the attempt is reconciled, never replayed:
// the attempt is unknown, the assistant message errored, turn.failed with
// reason outcome_unknown, and no second provider attempt; a prompt queued
// behind it in the same session still runs (invariant 7).
func TestCrashAfterProviderIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-intent"
	first, second := prompt(session, "first"), prompt(session, "second")

	crashing := b.start(t, "consumer-1", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'`, session),
		"the intent was committed before the crash")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'pending'`, first.MessageID))

	b.start(t, "consumer-2", "", "--lease", "1s", "--recovery-interval", "300ms")
	b.send(t, first) // a redelivery too: still an exact retry
	b.send(t, second)
	failed := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, second.MessageID).Type, "the prompt queued behind it runs")

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts a JOIN messages m ON m.message_id = a.assistant_message_id
		WHERE $1 = ANY(m.answers)`, first.MessageID), "no second provider attempt for the uncertain turn")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'unknown'`, session))
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'errored'`, first.MessageID))
	require.Equal(t, 1, b.count(t, assistantAnswering, first.MessageID), "no second assistant message")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, first.MessageID)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'reconciled'`, session))
}

// TestCrashAfterDeclinedTurnWithPromptWaiting: a parked turn resumed by a
// reject reply fails (declined) before its step reached the provider, so
// its step's assistant message had not been created; a prompt waits behind
// it, so the claim is kept. Killed right after that failure committed, the
// claim must name an assistant message that exists: recovery then clears
// it with a wake and the waiting prompt runs, nothing quarantined.
//
// It catches: a failed turn that points the claim (and turn.failed) at a
// message never inserted, which recovery quarantines ("claim points at
// missing assistant message") and the waiting prompt never runs.
func TestCrashAfterDeclinedTurnWithPromptWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-declined"
	asking, queued := prompt(session, `/tool echo {"text":"no"}`), prompt(session, "queued behind the declined turn")
	flags := []string{"--tool-permission", "echo=ask", "--lease", "1s"}

	parking := b.start(t, "consumer-1", "", flags...)
	b.send(t, asking)
	asked := b.events.waitAsked(t, session)
	b.send(t, queued)
	require.Eventually(t, func() bool { return len(b.events.admittedEvents(t, queued.MessageID)) > 0 },
		crashTimeout, 20*time.Millisecond, "the queued prompt is admitted")
	require.True(t, parking.stop(t).Success(), "consumer-1 ends cleanly on SIGTERM")

	crashing := b.start(t, "consumer-2", faults.TurnAfterFail, flags...)
	sendReply(t, b, session, replyJSON(t, envelope.PermissionReply{RequestID: asked.RequestID, Reply: envelope.ReplyReject}))
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND phase = 'safe'`, session),
		"the failure committed with the claim kept for the waiting prompt")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims c JOIN messages m ON m.message_id = c.assistant_message_id
		WHERE c.session_id = $1 AND m.role = 'assistant' AND m.status = 'errored'`, session),
		"the kept claim names the failed turn's errored assistant message")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NOT NULL`, queued.MessageID),
		"killed before the waiting prompt's promotion")

	b.start(t, "consumer-3", "", append(flags, "--recovery-interval", "300ms")...)
	next := b.events.waitTurn(t, queued.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, next.Type, "%+v", next)
	require.Equal(t, "echo: queued behind the declined turn", next.Text)

	failed := b.events.waitTurn(t, asking.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type)
	require.Equal(t, envelope.FailDeclined, failed.Reason)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND status = 'errored'`, failed.AssistantMessageID),
		"turn.failed names a message of the transcript")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason IS NOT NULL`, session), "no claim quarantined")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'quarantined'`, session), "no quarantine decision")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND quarantine_reason IS NOT NULL`, session), "no input quarantined")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, asking.MessageID)), "one turn event for the declined prompt")
}
