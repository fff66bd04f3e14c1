package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// sizedProvider answers text; with call (or calls), its first step asks
// for them instead.
type sizedProvider struct {
	text  string
	call  *provider.ToolCall
	calls int
}

func (p sizedProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	afterTools := len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == "tool"
	switch {
	case afterTools:
	case p.call != nil:
		return provider.Response{ToolCalls: []provider.ToolCall{*p.call}}, nil
	case p.calls > 0:
		calls := make([]provider.ToolCall, p.calls)
		for i := range calls {
			calls[i] = provider.ToolCall{ID: fmt.Sprintf("model-call-%06d", i), Name: "echo", Input: json.RawMessage(`{"text":"hi"}`)}
		}
		return provider.Response{ToolCalls: calls}, nil
	}
	return provider.Response{Text: p.text}, nil
}

// An answer, an error or a tool input too large for one Kafka message
// once it is an event (or that JSON's escaping makes so) was quarantined
// by the relay: the turn's end never reached the session's watchers, and
// an ask never reached anyone, so its session stayed parked for good; a
// release of the row only quarantined it again. The event carries what
// fits and says it was cut (truncated); the transcript holds the whole.
func TestEventsOfLargeOutsideContentArePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type want struct {
		typ   string
		cut   bool // the text is a prefix of the answer, or the ask's input left out
		calls bool // step.completed's tool calls: the first ones
	}
	for _, tc := range []struct {
		name string
		p    sizedProvider
		ask  bool
		want []want
	}{{
		name: "AnswerLargerThanAMessage",
		p:    sizedProvider{text: strings.Repeat("a", 1_100_000)},
		want: []want{{typ: envelope.EventStepCompleted, cut: true}, {typ: envelope.EventTurnCompleted, cut: true}},
	}, {
		// 300 kB of text, 1.3 MB as JSON that escapes < and > as \u003c:
		// written unescaped, it fits whole.
		name: "AnswerThatJSONEscapingInflates",
		p:    sizedProvider{text: strings.Repeat("<a>", 100_000)},
		want: []want{{typ: envelope.EventStepCompleted}, {typ: envelope.EventTurnCompleted}},
	}, {
		name: "AskForACallWithALargeInput",
		p: sizedProvider{text: "done", call: &provider.ToolCall{ID: "c1", Name: "echo",
			Input: json.RawMessage(`{"text":"` + strings.Repeat("x", 1_100_000) + `"}`)}},
		ask:  true,
		want: []want{{typ: envelope.EventPermissionAsked, cut: true}},
	}, {
		// 200 kB of input, 1.2 MB escaped: fits whole unescaped.
		name: "AskForACallWithMarkupInItsInput",
		p: sizedProvider{text: "done", call: &provider.ToolCall{ID: "c1", Name: "echo",
			Input: json.RawMessage(`{"text":"` + strings.Repeat("<", 200_000) + `"}`)}},
		ask:  true,
		want: []want{{typ: envelope.EventPermissionAsked}},
	}, {
		// A step of 8,000 calls: step.completed lists them all, 1.2 MB.
		name: "StepWithThousandsOfCalls",
		p:    sizedProvider{calls: 8_000},
		ask:  true,
		want: []want{{typ: envelope.EventStepCompleted, cut: true, calls: true}, {typ: envelope.EventPermissionAsked}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			broker := testkit.Broker(t, testPartitions)
			brokers := []string{broker.Addr()}
			kc := testkit.NewKafkaClient(t, brokers)
			events := testkit.ReadTopic(t, brokers, "session-events", nil)
			relay := outbox.NewRelay(b.pool, kc.Producer, &outbox.RelayConfig{
				MaxMessageBytes: kc.Config.Producer.MaxMessageBytes, Logger: testkit.Logger(t, nil)})

			reg := tools.NewRegistry()
			require.NoError(t, reg.Register(tools.NewEcho()))
			cfg := &executor.ExecutorConfig{
				Claims:   ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "o"}), // a step of 8,000 calls takes seconds to record
				Provider: tc.p, Tools: reg,
			}
			if tc.ask {
				cfg.PermissionFunc = func(string) tools.Permission { return tools.Ask }
			}
			e := newExecutor(t, b.pool, cfg)
			t.Cleanup(e.StopNow)

			sess, msg := id(t, "s"), id(t, "m")
			b.admit(t, sess, msg, "go")
			done, err := e.Wake(ctx, sess, 0)
			require.NoError(t, err)
			wait(t, done)
			require.NoError(t, relay.Flush(ctx))

			var reasons []string
			rows, err := b.pool.Query(ctx, `SELECT quarantine_reason FROM outbox WHERE quarantine_reason IS NOT NULL`)
			require.NoError(t, err)
			for rows.Next() {
				var r string
				require.NoError(t, rows.Scan(&r))
				reasons = append(reasons, r)
			}
			require.NoError(t, rows.Err())
			require.Empty(t, reasons, "no event is quarantined")

			schema := testkit.EventSchema(t)
			for _, w := range tc.want {
				var got *envelope.Event
				require.Eventually(t, func() bool {
					for _, m := range events.All() {
						ev, err := envelope.DecodeEvent(m.Value)
						require.NoError(t, err)
						if ev.Type == w.typ {
							testkit.RequireValid(t, schema, m.Value)
							got = &ev
							return true
						}
					}
					return false
				}, 20*time.Second, 10*time.Millisecond, "%s published", w.typ)
				require.Equal(t, w.cut, got.Truncated, "%s says whether it was cut", w.typ)
				switch {
				case w.calls:
					require.NotEmpty(t, got.ToolCalls)
					require.Less(t, len(got.ToolCalls), tc.p.calls, "the calls that fit")
					for i, c := range got.ToolCalls {
						require.Equal(t, fmt.Sprintf("model-call-%06d", i), c.ModelCallID, "the first calls, in order")
					}
				case tc.ask && w.cut:
					require.Nil(t, got.Input, "an input that does not fit is left out, not cut")
					require.NotEmpty(t, got.RequestID)
				case tc.ask && tc.p.call != nil:
					require.JSONEq(t, string(tc.p.call.Input), string(got.Input))
				case tc.ask:
				case w.cut:
					require.True(t, strings.HasPrefix(tc.p.text, got.Text), "%s carries a prefix of the answer", w.typ)
					require.Greater(t, len(got.Text), 900_000, "%s carries what fits", w.typ)
				default:
					require.Equal(t, tc.p.text, got.Text)
				}
			}
			if !tc.ask {
				var stored int
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT sum(length(p.body)) FROM message_parts p JOIN messages m USING (message_id)
WHERE m.session_id = $1 AND m.role = 'assistant'`, sess).Scan(&stored))
				require.Equal(t, len(tc.p.text), stored, "the transcript holds the whole answer")
			}
		})
	}
}
