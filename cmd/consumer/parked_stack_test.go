//go:build !race

// The race detector's instrumentation deepens every frame: a stack under
// it measures the detector, not the consumer's path.

package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// An execution waiting on its provider keeps its goroutine's stack: ten
// thousand in flight keep ten thousand stacks (issue 21's in-flight
// figures). A stack grows to the deepest call its goroutine made and
// comes back down only when less than a quarter of it is in use; a parked
// execution uses some 5 KiB, so it keeps 8 KiB while every call of its
// claim and first step stays under that, and 16 KiB from the first call
// that passes it: 80 MiB more at ten thousand (docs/benchmarks.md, "A few
// bytes of a frame"; the first step's JSON encoding did so, executor's
// onOwnStack). This is that figure's guard, on the consumer process
// itself (its pipeline, loggers and metrics on the path, which an
// executor in a test process misses), at a steady rate as in the bench:
// executions start while hundreds of others wait, and the stack memory
// per execution is read from the process's own /metrics.
func TestParkedExecutionsKeepEightKiBStacks(t *testing.T) {
	t.Parallel()
	perExecution := parkedStackPerExecution(t, "s-parked", func(sleep time.Duration) string {
		return fmt.Sprintf("/sleep %s\nwait", sleep)
	})
	// 8 KiB a stack and a goroutine or so an execution: under 12 KiB;
	// past 8 KiB of depth, about 16.
	require.Less(t, perExecution, 12.0*1024,
		"each waiting execution keeps a stack past 8 KiB: a call of its claim or first step went deeper than 8 KiB on its goroutine")
}

// A turn with tools waits on its provider again after its tool calls,
// in its second step, with whatever stack its first step's answer, its
// calls and the second step's intent left it: their events and the
// second request's hash are encoded on the way (stepCompleted,
// toolEvent, beginStep), 17.9 KiB a waiting execution while they were
// encoded on its goroutine. Agent turns are mostly such turns.
func TestParkedToolTurnsKeepEightKiBStacks(t *testing.T) {
	t.Parallel()
	perExecution := parkedStackPerExecution(t, "s-parked-tool", func(sleep time.Duration) string {
		return fmt.Sprintf("/tool echo {\"text\": \"x\"}\n/sleep-after-tools %s\nwait", sleep)
	})
	require.Less(t, perExecution, 12.0*1024,
		"each execution waiting in a turn's second step keeps a stack past 8 KiB: a call of its first step's answer, its tool calls or its second step's intent went deeper than 8 KiB on its goroutine")
}

// An execution waiting on the HTTP provider (a real provider's path:
// net/http's client under the executor's frames) parks 7.4 KiB deep,
// 0.6 KiB short of a stack of 8 (docs/benchmarks.md, "the stack a real
// provider parks on"): a frame or two more on that path and every such
// execution keeps 16 KiB, 80 MiB more at ten thousand in flight. Each
// request in flight also has its connection's two goroutines in net/http
// (readLoop, writeLoop), 8 KiB each. Measured: 25.2-25.5 KiB per
// execution (about one in seven executions at 16 KiB, from a call deeper
// than the wait before it; not the request's encoding, which moved to a
// goroutine of its own changed nothing); with 1 KiB more on the path to
// the wait, 30.0.
func TestParkedHTTPProviderExecutionsKeepEightKiBStacks(t *testing.T) {
	t.Parallel()
	const wait = 8 * time.Second
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		select {
		case <-time.After(wait):
		case <-r.Context().Done():
			return
		}
		answerOK(w)
	}))
	t.Cleanup(srv.Close)
	perExecution := parkedStackPerExecution(t, "s-parked-http", func(time.Duration) string {
		return strings.Repeat("a long prompt, as an agent's are. ", 60)
	}, "--provider", "http", "--provider-url", srv.URL)
	require.Less(t, perExecution, 28.0*1024,
		"each execution waiting on the HTTP provider keeps a stack past 8 KiB: its path to the wait went deeper than 8 KiB")
}

// parkedStackPerExecution runs a consumer at a steady 100 prompts a
// second for 12 s, each prompt (text(8s) in a session of its own, named
// from prefix) waiting 8 s on its provider, and returns the stack memory
// per waiting execution, read from the process's own /metrics.
func parkedStackPerExecution(t *testing.T, prefix string, text func(sleep time.Duration) string, extra ...string) float64 {
	b := setup(t)
	const (
		rate    = 100 // prompts a second
		seconds = 12
		sleep   = 8 * time.Second
	)
	c := b.startConsumer(t, "c1", append([]string{"--max-sessions", "2000", "--log-level", "info", "--shutdown-grace", "100ms"}, extra...)...)
	baseStack := c.metric(t, "go_memstats_stack_inuse_bytes")
	baseGoroutines := c.metric(t, "go_goroutines")

	tick := time.NewTicker(time.Second / 10)
	defer tick.Stop()
	for i := range rate * seconds / 10 {
		msgs := make([]*sarama.ProducerMessage, 0, 10)
		for j := range 10 {
			p := prompt(fmt.Sprintf("%s-%d-%d", prefix, i, j), text(sleep))
			v, err := envelope.Marshal(p)
			require.NoError(t, err)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(p.SessionID), Value: sarama.ByteEncoder(v)})
		}
		require.NoError(t, b.producer.SendMessages(msgs))
		<-tick.C
	}
	// The steady state: about rate × sleep executions waiting, while
	// others end and start. The smallest figure over thirty samples with
	// at least half of them waiting (a slow machine may take longer to
	// get there), so that a stack not yet shrunk by the collector does
	// not count.
	var perExecution, executions, goroutines float64
	perExecution = 1 << 30
	samples := 0
	require.Eventually(t, func() bool {
		stack := c.metric(t, "go_memstats_stack_inuse_bytes")
		n := c.metric(t, "promptline_active_executions")
		if n >= rate*sleep.Seconds()/2 {
			samples++
			if (stack-baseStack)/n < perExecution {
				perExecution, executions, goroutines = (stack-baseStack)/n, n, c.metric(t, "go_goroutines")
			}
		}
		return samples >= 30
	}, 20*time.Second, 100*time.Millisecond, "thirty samples with half of the turns waiting on their provider")
	t.Logf("%.0f executions waiting, %.0f goroutines (%.0f before): %.0f bytes of stack per execution", executions, goroutines, baseGoroutines, perExecution)
	return perExecution
}
