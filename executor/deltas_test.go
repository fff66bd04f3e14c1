package executor_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

// streamingProvider is the OpenAI-compatible provider with stream: true
// against a server that streams cfg over server-sent events.
func streamingProvider(t *testing.T, cfg testkit.OpenAIStreamConfig) provider.Provider {
	t.Helper()
	srv := httptest.NewServer(testkit.OpenAIStreamHandler(cfg))
	t.Cleanup(srv.Close)
	p, err := providers.NewOpenAI(srv.Client(), &providers.OpenAIConfig{BaseURL: srv.URL, Model: "m", APIKey: "k", Stream: true})
	require.NoError(t, err)
	return p
}

func TestLiveDeltas(t *testing.T) {
	t.Parallel()

	t.Run("InOrderAndTheirTextIsTheStepsText", func(t *testing.T) {
		t.Parallel()
		var frags []string
		for i := range 40 {
			frags = append(frags, fmt.Sprintf("w%02d ", i))
		}
		results := &testkit.Counts{}
		b := setup(t, setupOpts{deltas: true, deltaResults: results,
			provider: streamingProvider(t, testkit.OpenAIStreamConfig{Fragments: frags, Gap: 5 * time.Millisecond})})
		sess, msg := id(t, "s"), id(t, "m")
		started := time.Now()
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "stream please"})
		done := b.waitTurn(t, msg)
		elapsed := time.Since(started)
		require.Equal(t, envelope.EventTurnCompleted, done.Type)
		want := strings.Join(frags, "")
		require.Equal(t, want, done.Text)

		step := stepCompleted(t, b, sess)
		require.Equal(t, want, step.Text)

		var ds []envelope.Delta
		require.Eventually(t, func() bool {
			ds = deltasOf(t, b, sess)
			return concat(ds) == want
		}, 10*time.Second, 10*time.Millisecond, "deltas of %s", sess)
		for i, d := range ds {
			require.Equal(t, int64(i+1), d.Seq, "in order, numbered from 1")
			require.Equal(t, step.TurnID, d.TurnID)
			require.Equal(t, step.AssistantMessageID, d.AssistantMessageID)
			require.Equal(t, step.Step, d.Step)
		}
		// 40 fragments over ≥200ms: coalesced every 50ms (bytes are far
		// below 1 KiB), so a handful of messages, never one per fragment.
		require.Greater(t, len(ds), 1, "streamed, not sent at the end")
		require.LessOrEqual(t, len(ds), int(elapsed/(50*time.Millisecond))+2)
		require.Less(t, len(ds), len(frags))
		require.Equal(t, len(ds), results.Get("published"))
		require.Zero(t, results.Get("dropped"))
	})

	t.Run("CoalescedByBytes", func(t *testing.T) {
		t.Parallel()
		frag := strings.Repeat("x", 63) + "\n"
		frags := make([]string, 200) // 12,800 bytes, streamed at once
		for i := range frags {
			frags[i] = frag
		}
		results := &testkit.Counts{}
		b := setup(t, setupOpts{deltas: true, deltaResults: results, provider: streamingProvider(t, testkit.OpenAIStreamConfig{Fragments: frags})})
		sess, msg := id(t, "s"), id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "a lot"})
		done := b.waitTurn(t, msg)
		want := strings.Join(frags, "")
		require.Equal(t, want, done.Text)
		var ds []envelope.Delta
		if !assert.Eventually(t, func() bool {
			ds = deltasOf(t, b, sess)
			return concat(ds) == want
		}, 10*time.Second, 10*time.Millisecond) {
			require.FailNow(t, "deltas", "%d deltas, %d bytes of %d; seqs %v; published %v dropped %v", len(ds), len(concat(ds)), len(want), seqs(ds), results.Get("published"), results.Get("dropped"))
		}
		require.Equal(t, len(ds), results.Get("published"))
		for _, d := range ds[:len(ds)-1] {
			// A delta is published at 1 KiB or when its 50ms are up: with
			// the whole stream in the socket, at 1 KiB (a fragment may
			// take it past).
			require.LessOrEqual(t, len(d.Text), 1024+len(frag)-1)
		}
		require.GreaterOrEqual(t, len(ds), len(want)/(1024+len(frag)))
		require.LessOrEqual(t, len(ds), len(want)/1024+4, "coalesced to about 1 KiB each")
	})

	t.Run("BrokenDeltasProducerDoesNotFailTheTurn", func(t *testing.T) {
		t.Parallel()
		results := &testkit.Counts{}
		frags := []string{"every ", "delta ", "is ", "too ", "large ", "for ", "the ", "producer"}
		// The deltas producer refuses every message (too large): each is
		// dropped and counted; the answer is committed and announced.
		var logs testkit.LogBuffer
		b := setup(t, setupOpts{deltas: true, deltasMaxMessageBytes: 16, deltaResults: results, logs: &logs,
			provider: streamingProvider(t, testkit.OpenAIStreamConfig{Fragments: frags, Gap: 20 * time.Millisecond})})
		sess, msg := id(t, "s"), id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "go"})
		done := b.waitTurn(t, msg)
		require.Equal(t, envelope.EventTurnCompleted, done.Type)
		require.Equal(t, strings.Join(frags, ""), done.Text)
		require.Equal(t, strings.Join(frags, ""), stepCompleted(t, b, sess).Text)
		require.Eventually(t, func() bool {
			return results.Get("dropped") > 0
		}, 10*time.Second, 10*time.Millisecond)
		require.Zero(t, results.Get("published"))
		require.Empty(t, deltasOf(t, b, sess))
		// Each drop is logged (at debug) with the producer's reason.
		require.Contains(t, logs.String(), "delta dropped")
		require.Contains(t, logs.String(), "larger than")
	})
}

// stepCompleted waits for the session's (only) step.completed.
func stepCompleted(t *testing.T, b *testBundle, sess string) envelope.Event {
	t.Helper()
	var step envelope.Event
	require.Eventually(t, func() bool {
		for _, m := range b.events.All() {
			if string(m.Key) != sess {
				continue
			}
			e, err := envelope.DecodeEvent(m.Value)
			require.NoError(t, err)
			if e.Type == envelope.EventStepCompleted {
				step = e
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond)
	return step
}

// deltasOf returns the session's deltas in their partition's order, each
// validated against the published schema.
func deltasOf(t *testing.T, b *testBundle, sess string) []envelope.Delta {
	t.Helper()
	schema := testkit.DeltaSchema(t)
	var out []envelope.Delta
	for _, m := range b.deltas.All() {
		if string(m.Key) != sess {
			continue
		}
		testkit.RequireValid(t, schema, m.Value)
		var d envelope.Delta
		require.NoError(t, json.Unmarshal(m.Value, &d))
		require.Equal(t, sess, d.SessionID)
		out = append(out, d)
	}
	return out
}

func concat(ds []envelope.Delta) string {
	var sb strings.Builder
	for _, d := range ds {
		sb.WriteString(d.Text)
	}
	return sb.String()
}

func seqs(ds []envelope.Delta) []int64 {
	var out []int64
	for _, d := range ds {
		out = append(out, d.Seq)
	}
	return out
}

// Close returns once every delta the broker acknowledged is counted, even
// while the counting lags behind the producer's shutdown.
func TestDeltaPublisherCloseCountsEveryAcknowledgement(t *testing.T) {
	t.Parallel()
	broker := testkit.Broker(t, testPartitions)
	kc := testkit.NewKafkaClient(t, []string{broker.Addr()})
	ap, err := sarama.NewAsyncProducer([]string{broker.Addr()}, executor.DeltaProducerConfig(kc.Config))
	require.NoError(t, err)
	results := &testkit.Counts{}
	release := make(chan struct{})
	var first sync.Once
	p := executor.NewDeltaPublisher(ap, &executor.DeltaPublisherConfig{OnDeltaFunc: func(result string) {
		first.Do(func() { <-release }) // the counting falls behind
		results.Add(result)
	}})
	const n = 50
	for i := range n {
		p.PublishDelta(envelope.Delta{SessionID: "s", Seq: int64(i + 1), Text: "x"})
	}
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	// Close cannot return while the counting is held back.
	select {
	case <-closed:
		t.Fatal("Close returned before the acknowledgements were counted")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-closed
	require.Equal(t, n, results.Get("published"))
	require.Zero(t, results.Get("dropped"))
}
