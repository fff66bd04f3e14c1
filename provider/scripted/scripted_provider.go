package scripted

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/provider"
)

// ScriptedProvider answers without a model, for demos and tests. By default
// it echoes the turn's text ("echo: <text>"). Lines of a prompt that start
// with a directive steer it:
//
//	/reply TEXT        answer TEXT instead of the echo
//	/sleep DURATION    wait (Go duration, e.g. 200ms) before answering
//	                   (the first step of a turn with tools)
//	/sleep-after-tools DURATION
//	                   wait that long before answering tool results (the
//	                   steps after the first, as a model thinks again)
//	/stream DURATION   stream the answer's text a word at a time, DURATION
//	                   apart, to the request's TextDeltaFunc (live deltas)
//	/fail MESSAGE      fail the provider step with MESSAGE
//	/response-id ID    report ID as the provider's response ID at once
//	                   (ResponseIDFunc), as a real provider's first bytes
//	                   would; put it before /sleep to have it recorded
//	                   while the step is in flight
//	/tool NAME {json}  request a call of tool NAME with that input (several
//	                   lines: several calls in one step)
//	/loop NAME {json}  request that call at every step, after tool results
//	                   too: the turn ends at the step limit (max_steps)
//	/crash             only in a binary built with the faults tag: SIGKILL
//	                   the process, every time the step is sent (a turn
//	                   that crashes its process each time it runs); in
//	                   other builds an ordinary line
//
// After tool results it answers "tool results: NAME: OUTPUT; ..." (or the
// /reply text), so a turn with tools takes two steps.
type ScriptedProvider struct{}

var (
	_ provider.Provider   = ScriptedProvider{}
	_ provider.ModelNamer = ScriptedProvider{}
)

// ModelName is "scripted": the model recorded with its attempts.
func (ScriptedProvider) ModelName() string { return "scripted" }

// Complete runs the directives of the turn's messages.
func (ScriptedProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	var reply *string
	var echo []string
	var calls, loop []provider.ToolCall
	var stream time.Duration
	afterTools := len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == "tool"
	for _, m := range req.Turn {
		for _, line := range strings.Split(m.Text, "\n") {
			directive, arg, _ := strings.Cut(line, " ")
			switch directive {
			case "/crash":
				if !faults.Enabled {
					echo = append(echo, line)
					continue
				}
				faults.Crash()
			case "/reply":
				reply = &arg
			case "/sleep", "/sleep-after-tools":
				if afterTools != (directive == "/sleep-after-tools") {
					continue
				}
				if err := sleepFor(ctx, directive, arg); err != nil {
					return provider.Response{}, err
				}
			case "/stream":
				d, err := time.ParseDuration(strings.TrimSpace(arg))
				if err != nil {
					return provider.Response{}, fmt.Errorf("scripted provider: /stream %q: %w", arg, err)
				}
				stream = d
			case "/response-id":
				if !afterTools && req.ResponseIDFunc != nil {
					req.ResponseIDFunc(strings.TrimSpace(arg))
				}
			case "/fail":
				if !afterTools {
					return provider.Response{}, fmt.Errorf("scripted provider: %s", arg)
				}
			case "/loop":
				name, input, _ := strings.Cut(strings.TrimSpace(arg), " ")
				loop = append(loop, provider.ToolCall{ID: fmt.Sprintf("loop-%d", len(loop)), Name: name, Input: json.RawMessage(cmp.Or(strings.TrimSpace(input), "{}"))})
			case "/tool":
				name, input, _ := strings.Cut(strings.TrimSpace(arg), " ")
				input = strings.TrimSpace(input)
				if input == "" {
					input = "{}"
				}
				calls = append(calls, provider.ToolCall{ID: fmt.Sprintf("call-%d", len(calls)), Name: name, Input: json.RawMessage(input)})
			default:
				echo = append(echo, line)
			}
		}
	}
	if len(loop) > 0 {
		return provider.Response{ToolCalls: loop}, nil
	}
	if !afterTools && len(calls) > 0 {
		return provider.Response{ToolCalls: calls}, nil
	}
	var text string
	switch {
	case reply != nil:
		text = *reply
	case afterTools:
		text = "tool results: " + toolResults(req.Messages)
	default:
		text = "echo: " + strings.Join(echo, "\n")
	}
	if stream > 0 && req.TextDeltaFunc != nil {
		if err := streamWords(ctx, text, stream, req.TextDeltaFunc); err != nil {
			return provider.Response{}, err
		}
	}
	return provider.Response{Text: text}, nil
}

// sleepFor waits for the duration arg of directive, or until ctx ends.
func sleepFor(ctx context.Context, directive, arg string) error {
	d, err := time.ParseDuration(strings.TrimSpace(arg))
	if err != nil {
		return fmt.Errorf("scripted provider: %s %q: %w", directive, arg, err)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// streamWords hands text to delta a word (with the space after it) at a
// time, every gap, as a streaming model would.
func streamWords(ctx context.Context, text string, gap time.Duration, delta func(string)) error {
	t := time.NewTicker(gap)
	defer t.Stop()
	for rest := text; rest != ""; {
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			i = len(rest) - 1
		}
		delta(rest[:i+1])
		rest = rest[i+1:]
		if rest == "" {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// toolResults summarises the results after the last assistant message.
func toolResults(msgs []provider.TranscriptMessage) string {
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
