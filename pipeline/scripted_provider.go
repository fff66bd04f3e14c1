package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ScriptedProvider answers without a model, for demos and tests. By default
// it echoes the turn's text ("echo: <text>"). Lines of a prompt that start
// with a directive steer it:
//
//	/reply TEXT        answer TEXT instead of the echo
//	/sleep DURATION    wait (Go duration, e.g. 200ms) before answering
//	/fail MESSAGE      fail the provider step with MESSAGE
//	/tool NAME {json}  request a call of tool NAME with that input (several
//	                   lines: several calls in one step)
//	/loop NAME {json}  request that call at every step, after tool results
//	                   too: the turn ends at the step limit (max_steps)
//
// After tool results it answers "tool results: NAME: OUTPUT; ..." (or the
// /reply text), so a turn with tools takes two steps.
type ScriptedProvider struct{}

var _ Provider = ScriptedProvider{}

// Complete runs the directives of the turn's messages.
func (ScriptedProvider) Complete(ctx context.Context, req ProviderRequest) (ProviderResponse, error) {
	var reply *string
	var echo []string
	var calls, loop []ToolCall
	afterTools := len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == "tool"
	for _, m := range req.Turn {
		for _, line := range strings.Split(m.Text, "\n") {
			directive, arg, _ := strings.Cut(line, " ")
			switch directive {
			case "/reply":
				reply = &arg
			case "/sleep":
				if afterTools {
					continue
				}
				d, err := time.ParseDuration(strings.TrimSpace(arg))
				if err != nil {
					return ProviderResponse{}, fmt.Errorf("scripted provider: /sleep %q: %w", arg, err)
				}
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return ProviderResponse{}, ctx.Err()
				case <-t.C:
				}
			case "/fail":
				if !afterTools {
					return ProviderResponse{}, fmt.Errorf("scripted provider: %s", arg)
				}
			case "/loop":
				name, input, _ := strings.Cut(strings.TrimSpace(arg), " ")
				loop = append(loop, ToolCall{ID: fmt.Sprintf("loop-%d", len(loop)), Name: name, Input: json.RawMessage(cmp.Or(strings.TrimSpace(input), "{}"))})
			case "/tool":
				name, input, _ := strings.Cut(strings.TrimSpace(arg), " ")
				input = strings.TrimSpace(input)
				if input == "" {
					input = "{}"
				}
				calls = append(calls, ToolCall{ID: fmt.Sprintf("call-%d", len(calls)), Name: name, Input: json.RawMessage(input)})
			default:
				echo = append(echo, line)
			}
		}
	}
	if len(loop) > 0 {
		return ProviderResponse{ToolCalls: loop}, nil
	}
	if afterTools {
		if reply != nil {
			return ProviderResponse{Text: *reply}, nil
		}
		return ProviderResponse{Text: "tool results: " + toolResults(req.Messages)}, nil
	}
	if len(calls) > 0 {
		return ProviderResponse{ToolCalls: calls}, nil
	}
	if reply != nil {
		return ProviderResponse{Text: *reply}, nil
	}
	return ProviderResponse{Text: "echo: " + strings.Join(echo, "\n")}, nil
}

// toolResults summarises the results after the last assistant message.
func toolResults(msgs []TranscriptMessage) string {
	start := len(msgs)
	for start > 0 && msgs[start-1].Role == "tool" {
		start--
	}
	names := map[string]string{}
	if start > 0 {
		for _, c := range msgs[start-1].ToolCalls {
			names[c.ID] = c.Name
		}
	}
	var parts []string
	for _, m := range msgs[start:] {
		parts = append(parts, names[m.ToolCallID]+": "+m.Text)
	}
	return strings.Join(parts, "; ")
}
