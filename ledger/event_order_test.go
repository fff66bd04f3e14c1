package ledger_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// A later turn's first step (promptline_turn_next) opens with the fence
// alone, not the session's lock, so an admission of the same session runs
// beside it: the step takes its outbox ID first, the admission the next
// one and commits first. The relay publishes what has committed, in ID
// order, without waiting for a lower ID still in flight. So the two
// overlapping events of one session reach Kafka in the order they
// committed when a relay pass came between the commits, in ID order when
// none did; never lost, and always before the events of a write that
// began after both committed (docs/session-events.md, "In order per
// session").
func TestSessionEventsOfOverlappingWrites(t *testing.T) {
	t.Parallel()

	for _, c := range []struct {
		name        string
		passBetween bool
		want        []string
	}{
		{"ARelayPassBetweenTheCommitsPublishesInCommitOrder", true,
			[]string{envelope.EventInputAdmitted, envelope.EventTurnStarted, envelope.EventTurnCompleted}},
		{"OnePassAfterBothPublishesInIDOrder", false,
			[]string{envelope.EventTurnStarted, envelope.EventInputAdmitted, envelope.EventTurnCompleted}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := overlappingWrites(t, c.passBetween)
			types := make([]string, len(got))
			for i, e := range got {
				types[i] = e.Type
			}
			require.Equal(t, c.want, types, "the session's events on Kafka: %v", got)
			id := map[string]int64{}
			for _, e := range got {
				id[e.Type] = e.OutboxID
			}
			require.Less(t, id[envelope.EventTurnStarted], id[envelope.EventInputAdmitted],
				"the step took its outbox ID before the admission that committed first")
		})
	}
}

// publishedEvent is a session event as Kafka holds it.
type publishedEvent struct {
	Type     string
	OutboxID int64
}

// overlappingWrites runs the step and the admission of
// TestSessionEventsOfOverlappingWrites, then the turn's answer, with a
// relay pass between the two commits when passBetween, and returns the
// session's events as Kafka holds them, in order.
func overlappingWrites(t *testing.T, passBetween bool) []publishedEvent {
	t.Helper()
	ctx := context.Background()
	b := setup(t, time.Minute)
	broker := testkit.Broker(t, 4)
	producer, err := sarama.NewSyncProducer([]string{broker.Addr()}, kafkautil.NewConfig("event-order-test"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	relay := outbox.NewRelay(b.pool, producer, &outbox.RelayConfig{})
	topics := kafkautil.Topics{}.WithDefaults()
	event := func(typ string) []byte {
		p, err := json.Marshal(envelope.Event{ID: typ + ":s-a2", Type: typ, SessionID: "s", At: time.Now().UTC()})
		require.NoError(t, err)
		return p
	}

	// A claim held, its first turn done, a prompt waiting for the next.
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		VALUES ('s-second', 's', 'x', '\x00', 'queue', true)`)

	// The executor's next step, as executor/queued.go calls it: its
	// outbox row written, the transaction not committed.
	cl := x.Claim()
	step, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = step.Rollback(ctx) }()
	_, err = step.Exec(ctx, `SELECT promptline_turn_next($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
		cl.SessionID, cl.ExecutionID, cl.Token, int64(60_000), string(ledger.PhaseUnknown), "s-a2",
		[]string{"s-second"}, "s-a2", "s-a2", "p", "s-a2", []byte{1}, "", int64(1),
		[]string{topics.Events}, []string{"s"}, [][]byte{event(envelope.EventTurnStarted)})
	require.NoError(t, err)

	// A prompt of the same session is admitted meanwhile and commits. A
	// deadline, not a hang, should admission ever wait for the step.
	admitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := admission.NewAdmitter(b.pool, &admission.AdmitterConfig{}).Admit(admitCtx, []admission.Incoming{{
		Prompt: envelope.Prompt{MessageID: "s-third", SessionID: "s", Text: "x"},
	}})
	require.NoError(t, err, "admission waited for the executor's step")
	require.Equal(t, []admission.Outcome{admission.Admitted}, out)
	if passBetween {
		require.NoError(t, relay.Flush(ctx))
	}
	require.NoError(t, step.Commit(ctx))

	// The step's answer, a write begun after both commits.
	released, err := x.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, "", ledger.Call{Func: "promptline_turn_answer", Args: []any{
		"s-a2", int64(0), int64(0), "", "s-a2", "", []string{topics.Events}, []string{"s"}, [][]byte{event(envelope.EventTurnCompleted)},
	}})
	require.NoError(t, err)
	require.False(t, released, "the prompt admitted meanwhile waits")
	require.NoError(t, relay.Flush(ctx))

	var got []publishedEvent
	for _, m := range testkit.ReadAll(t, broker.Addr(), topics.Events) {
		var e envelope.Event
		require.NoError(t, json.Unmarshal(m.Value, &e))
		p := publishedEvent{Type: e.Type, OutboxID: -1}
		for _, h := range m.Headers {
			if string(h.Key) == outbox.HeaderOutboxID {
				p.OutboxID, err = strconv.ParseInt(string(h.Value), 10, 64)
				require.NoError(t, err)
			}
		}
		got = append(got, p)
	}
	return got
}
