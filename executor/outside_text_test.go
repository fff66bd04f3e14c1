package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// What arrives from outside (a model's answer and tool calls, a tool's
// output) may be what Postgres's text and jsonb columns refuse: bytes
// that are not UTF-8 (a body in latin-1), a NUL (a model's "\u0000"), a
// tool input that is not JSON. Refused with a data error, a result the
// executor holds went unrecorded: the claim expired with the call or the
// attempt started, and recovery made it unknown (or ran an idempotent
// tool again). Such text is stored with U+FFFD in place of what cannot be
// stored, and the turn goes on.

type latin1Tool struct{ runs chan struct{} }

func (latin1Tool) Spec() tools.Spec {
	return tools.Spec{Name: "latin1", Description: "answers in latin-1", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (l latin1Tool) Run(context.Context, tools.Call) (tools.Result, error) {
	l.runs <- struct{}{}
	return tools.Result{Output: "caf\xe9 \x00"}, nil
}

func TestToolOutputThatIsNotTextIsSettled(t *testing.T) {
	t.Parallel()
	b := setupExec(t)
	tool := latin1Tool{runs: make(chan struct{}, 4)}
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tool))
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg})
	t.Cleanup(e.StopNow)
	b.admit(t, "s", "m1", "/tool latin1 {}")
	done, err := e.Wake(context.Background(), "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Len(t, tool.runs, 1, "the tool ran once")
	var state, output string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT state, output FROM tool_calls WHERE session_id = 's'`).Scan(&state, &output))
	require.Equal(t, "succeeded", state, "the call ran and returned: its outcome is known")
	require.Equal(t, "caf\uFFFD \uFFFD", output)
	require.Equal(t, 2, b.answered(t, "m1"), "the tool step's message and the answer's: the turn went on")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim was released")
}

// outsideProvider answers the first step with resp, the next with "done".
type outsideProvider struct{ resp provider.Response }

func (p outsideProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	for _, m := range req.Messages {
		if m.Role == "tool" {
			return provider.Response{Text: "done"}, nil
		}
	}
	return p.resp, nil
}

func TestProviderAnswerThatIsNotTextIsRecorded(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		resp      provider.Response
		wantText  string
		wantInput string
	}{
		"NULInText":     {resp: provider.Response{Text: "before\x00after \xff"}, wantText: "before\uFFFDafter \uFFFD"},
		"InputNotJSON":  {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c\x00", Name: "echo", Input: json.RawMessage("{not json \xff")}}}, wantInput: "\"{not json \uFFFD\""},
		"LoneSurrogate": {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`{"a":"\ud800","b":"\uDC00x","c":"\ud83d\ude00"}`)}}}, wantInput: "{\"a\": \"\uFFFD\", \"b\": \"\uFFFDx\", \"c\": \"\U0001F600\"}"},
		// JSON numbers that Go's decoder takes and jsonb's numeric refuses
		// (value overflows numeric format): the input is kept as a string.
		"NumberTooLarge": {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`{"text": 1e1000000}`)}}}, wantInput: `"{\"text\": 1e1000000}"`},
		"NumberTooSmall": {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`[1.5e-20000]`)}}}, wantInput: `"[1.5e-20000]"`},
		"NumberInRange":  {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`[1e100000, 1e-16000, "1e999999"]`)}}}, wantInput: ""},
		"NULInInputJSON": {resp: provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`{"a":"x\u0000y","b\u0000":[1.50,"\\u0000"]}`)}}}, wantInput: "{\"a\": \"x\uFFFDy\", \"b\uFFFD\": [1.50, \"\\\\u0000\"]}"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: outsideProvider{tc.resp}, Tools: tools.NewRegistry()})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", "hello")
			done, err := e.Wake(context.Background(), "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state <> 'succeeded'`),
				"every attempt's answer was recorded")
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the turn is settled and the claim released")
			if tc.wantText != "" {
				var text string
				require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT p.body FROM message_parts p JOIN messages m USING (message_id)
					WHERE m.session_id = 's' AND m.role = 'assistant'`).Scan(&text))
				require.Equal(t, tc.wantText, text)
			}
			if tc.wantInput != "" {
				var input string
				require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT input::text FROM tool_calls WHERE session_id = 's'`).Scan(&input))
				require.Equal(t, tc.wantInput, input)
			}
		})
	}
}
