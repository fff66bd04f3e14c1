package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/internal/testkit"
)

// Permissions (issue "ledger") on real processes: a tool under
// --tool-permission echo=ask parks its session; the request is durable, so
// it survives a restart of the consumer; replies arrive through the
// permission-replies topic (key = session) and are admitted like prompts:
// valid ones resume the session, bad ones go to the rejects topic.

// sendReply publishes a raw permission reply with key = session.
func sendReply(t *testing.T, b *testBundle, session string, value []byte) {
	t.Helper()
	_, _, err := b.producer.SendMessage(&sarama.ProducerMessage{
		Topic: "permission-replies", Key: sarama.StringEncoder(session), Value: sarama.ByteEncoder(value),
	})
	require.NoError(t, err)
}

func replyJSON(t *testing.T, r envelope.PermissionReply) []byte {
	t.Helper()
	v, err := json.Marshal(r)
	require.NoError(t, err)
	return v
}

// waitAsked waits for the permission.asked event of session and returns it.
func (r *topicReader) waitAsked(t *testing.T, session string) envelope.Event {
	t.Helper()
	var found envelope.Event
	require.Eventually(t, func() bool {
		for _, e := range r.events(t) {
			if e.Type == envelope.EventPermissionAsked && e.SessionID == session {
				found = e
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "no permission.asked for %s", session)
	return found
}

// firstIndex is the position of the first event matching match, -1 if none.
// Events of one session share a partition, so their positions order them.
func (r *topicReader) firstIndex(t *testing.T, match func(envelope.Event) bool) int {
	t.Helper()
	return slices.IndexFunc(r.events(t), match)
}

// waitReject waits for the rejects-topic record carrying value that came
// from the permission-replies topic, and returns its reason header.
func (r *topicReader) waitReject(t *testing.T, value []byte) string {
	t.Helper()
	var reason string
	require.Eventually(t, func() bool {
		for _, m := range r.All() {
			if bytes.Equal(m.Value, value) && testkit.Header(m, "source_topic") == "permission-replies" {
				reason = testkit.Header(m, "reason")
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "no reject of %s", value)
	return reason
}

// TestPermissionRepliesAcrossRestart parks three sessions on consumer A
// (echo=ask), stops A with SIGTERM, starts B, and answers through Kafka:
// once (the tool runs once, the turn completes, and a prompt queued behind
// the ask runs only after it), reject (the turn fails, declined), reject
// with a message (the message goes back to the model, the turn completes);
// plus a reply to no request and a malformed reply, both rejected.
//
// It catches: a request that does not survive a restart, a parked session
// that runs a queued prompt before the reply (or never), a tool that runs
// twice or without approval, a declined turn that continues, feedback that
// does not reach the model, and bad replies that are dropped or admitted
// instead of rejected with their reason.
func TestPermissionRepliesAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rejects := readTopic(t, b.addr, "prompts.rejects")
	flags := []string{"--tool-permission", "echo=ask"}
	const (
		onceSession     = "s-perm-once"
		rejectSession   = "s-perm-reject"
		feedbackSession = "s-perm-feedback"
	)
	asking := map[string]envelope.Prompt{}
	for _, s := range []string{onceSession, rejectSession, feedbackSession} {
		asking[s] = prompt(s, `/tool echo {"text":"hi"}`)
	}
	queued := prompt(onceSession, "queued behind the ask")

	a := b.start(t, "consumer-a", "", flags...)
	requests := map[string]string{}
	for s, p := range asking {
		b.send(t, p)
		asked := b.events.waitAsked(t, s)
		require.NotEmpty(t, asked.RequestID)
		require.Equal(t, "echo", asked.Tool)
		require.JSONEq(t, `{"text":"hi"}`, string(asked.Input))
		requests[s] = asked.RequestID
	}
	// Queued while parked: A takes its wake and must not run it.
	b.send(t, queued)
	require.Eventually(t, func() bool { return len(b.events.admittedEvents(t, queued.MessageID)) > 0 },
		30*time.Second, 20*time.Millisecond, "the queued prompt is admitted")
	st := a.stop(t)
	require.True(t, st.Success(), "consumer A ends cleanly on SIGTERM: %s", st)

	consumerB := b.start(t, "consumer-b", "", flags...)
	metricsB := "http://" + consumerB.waitLog(t, "consumer running", time.Minute)["metrics_addr"].(string) + "/metrics"
	// The requests survived: pending, their calls requested and not run.
	for s, id := range requests {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests r JOIN tool_calls c ON c.call_id = r.call_id
			WHERE r.request_id = $1 AND r.session_id = $2 AND r.status = 'pending' AND c.state = 'requested'`, id, s), "request of %s", s)
	}
	require.Empty(t, b.events.turnEvents(t, queued.MessageID))
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NOT NULL`, queued.MessageID),
		"a parked session does not promote a queued prompt")

	// An operator looking at the parked session sees why it waits.
	out, stderr, code := runOnce(t, "session", "show", onceSession, "--json", "--database-url", b.dbURL)
	require.Zero(t, code, "consumer session show: %s", stderr)
	var rep inspect.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, inspect.StateParked, rep.State)
	require.Len(t, rep.PermissionRequests, 1)
	require.Equal(t, requests[onceSession], rep.PermissionRequests[0].RequestID)
	require.Equal(t, "pending", rep.PermissionRequests[0].Status)

	t.Run("OnceRunsTheToolOnceThenTheQueuedPrompt", func(t *testing.T) {
		t.Parallel()
		id := requests[onceSession]
		sendReply(t, b, onceSession, replyJSON(t, envelope.PermissionReply{RequestID: id, Reply: envelope.ReplyOnce}))
		first := b.events.waitTurn(t, asking[onceSession].MessageID)
		require.Equal(t, envelope.EventTurnCompleted, first.Type, "%+v", first)
		require.Equal(t, "tool results: echo: hi", first.Text)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, onceSession), "one call row")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND tool = 'echo'
			AND state = 'succeeded' AND call_id = $2`, onceSession, id), "the approved call ran, once")

		next := b.events.waitTurn(t, queued.MessageID)
		require.Equal(t, envelope.EventTurnCompleted, next.Type)
		require.Equal(t, "echo: queued behind the ask", next.Text)
		replied := b.events.firstIndex(t, func(e envelope.Event) bool {
			return e.Type == envelope.EventPermissionReplied && e.RequestID == id
		})
		firstAt := b.events.firstIndex(t, func(e envelope.Event) bool { return e.ID == first.ID })
		nextAt := b.events.firstIndex(t, func(e envelope.Event) bool { return e.ID == next.ID })
		require.GreaterOrEqual(t, replied, 0)
		require.Less(t, replied, firstAt, "the reply resumes the parked turn")
		require.Less(t, firstAt, nextAt, "the queued prompt's turn comes after the resumed one")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs i, permission_requests r
			WHERE i.message_id = $1 AND r.request_id = $2 AND i.promoted_at >= r.replied_at`, queued.MessageID, id),
			"the queued prompt was promoted only after the reply")

		// Another reply to the answered request: a conflict, rejected and
		// counted once, as a reject with its reason (a prompt's conflict is
		// counted by admission; a reply's was counted nowhere).
		conflicting := replyJSON(t, envelope.PermissionReply{RequestID: id, Reply: envelope.ReplyReject})
		sendReply(t, b, onceSession, conflicting)
		require.Equal(t, envelope.ReasonConflict, rejects.waitReject(t, conflicting))
		require.Eventually(t, func() bool {
			_, exposition := httpGet(t, metricsB)
			v, ok := metricValue(exposition, `promptline_admissions_total{outcome="rejected",reason="conflict"}`)
			return ok && v == 1
		}, 20*time.Second, 50*time.Millisecond, "the reply's conflict is counted")
	})

	t.Run("RejectDeclinesTheTurn", func(t *testing.T) {
		t.Parallel()
		id := requests[rejectSession]
		sendReply(t, b, rejectSession, replyJSON(t, envelope.PermissionReply{RequestID: id, Reply: envelope.ReplyReject}))
		failed := b.events.waitTurn(t, asking[rejectSession].MessageID)
		require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
		require.Equal(t, envelope.FailDeclined, failed.Reason)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'interrupted'`, rejectSession),
			"the declined call never ran")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, rejectSession), "claim cleared")
	})

	t.Run("RejectWithMessageIsFeedback", func(t *testing.T) {
		t.Parallel()
		id := requests[feedbackSession]
		sendReply(t, b, feedbackSession, replyJSON(t, envelope.PermissionReply{RequestID: id, Reply: envelope.ReplyReject, Message: "use something else"}))
		done := b.events.waitTurn(t, asking[feedbackSession].MessageID)
		require.Equal(t, envelope.EventTurnCompleted, done.Type, "%+v", done)
		require.Contains(t, done.Text, "declined: use something else")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'failed'`, feedbackSession),
			"the call is settled failed with the feedback, not run")
	})

	t.Run("ReplyToUnknownRequestIsRejected", func(t *testing.T) {
		t.Parallel()
		v := replyJSON(t, envelope.PermissionReply{RequestID: "no-such-request", Reply: envelope.ReplyOnce})
		sendReply(t, b, "s-perm-unknown", v)
		require.Equal(t, envelope.ReasonUnknownRequest, rejects.waitReject(t, v))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = 's-perm-unknown'`))
	})

	t.Run("MalformedReplyIsRejected", func(t *testing.T) {
		t.Parallel()
		v := []byte(`{"request_id": 1}`)
		_, err := envelope.DecodeReply(v, envelope.Limits{})
		var re *envelope.RejectError
		require.True(t, errors.As(err, &re), "DecodeReply: %v", err)
		require.Contains(t, []string{envelope.ReasonInvalidJSON, envelope.ReasonInvalidField}, re.Reason)
		sendReply(t, b, "s-perm-malformed", v)
		require.Equal(t, re.Reason, rejects.waitReject(t, v))
	})
}
