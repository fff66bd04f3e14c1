package pipeline

import (
	"context"
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
//	/tool NAME {json}  request a tool call (tools come with the ledger; for
//	                   now the turn fails with reason "unsupported")
type ScriptedProvider struct{}

var _ Provider = ScriptedProvider{}

// Complete runs the directives of the turn's messages.
func (ScriptedProvider) Complete(ctx context.Context, req ProviderRequest) (ProviderResponse, error) {
	var reply *string
	var echo []string
	for _, m := range req.Turn {
		for _, line := range strings.Split(m.Text, "\n") {
			directive, arg, _ := strings.Cut(line, " ")
			switch directive {
			case "/reply":
				reply = &arg
			case "/sleep":
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
				return ProviderResponse{}, fmt.Errorf("scripted provider: %s", arg)
			case "/tool":
				return ProviderResponse{}, fmt.Errorf("scripted provider: /tool %s: tools are not available in this version: %w", arg, ErrUnsupported)
			default:
				echo = append(echo, line)
			}
		}
	}
	if reply != nil {
		return ProviderResponse{Text: *reply}, nil
	}
	return ProviderResponse{Text: "echo: " + strings.Join(echo, "\n")}, nil
}
