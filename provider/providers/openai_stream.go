package providers

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/promptline/promptline/provider"
)

// The streamed Chat Completions format (stream: true): server-sent events
// whose data are chunks; "data: [DONE]" ends the stream. A chunk's first
// choice carries a delta: fragments of the content, and of tool calls
// (by index: id, name and arguments in pieces). With stream_options
// include_usage, a last chunk with no choices carries the usage.
type (
	openAIStreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	openAIChunk struct {
		ID      string `json:"id"`
		Choices []struct {
			Delta *struct {
				Content   *string `json:"content"`
				Refusal   *string `json:"refusal"`
				ToolCalls []struct {
					Index    *int   `json:"index"`
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function *struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage json.RawMessage `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
)

// streamedCall is a tool call assembled from its fragments.
type streamedCall struct {
	ID, Type, Name string
	Arguments      strings.Builder
	seenArguments  bool
}

// errMalformedStream marks a stream whose content cannot be an answer; the
// step fails like a malformed response (not retried unless the provider
// honours idempotency keys).
type errMalformedStream struct{ err error }

func (e *errMalformedStream) Error() string { return e.err.Error() }

// readOpenAIStream reads a streamed answer, passes its content fragments
// to onText (when set) as they arrive, and returns the answer assembled as
// the non-streamed body it stands for, so that decodeOpenAIResponse checks
// it as it checks any other. A body that is JSON (some compatible servers
// ignore stream: true, or answer an error with status 200) is returned as
// is. A read failure, or a stream that ends before it says it is done (no
// [DONE] and no finish_reason), wraps ErrOutcomeUnknown: the server may
// have acted. Anything else wrong is an *errMalformedStream. onID (when
// set) takes each chunk's id (the completion's ID), from the first chunk
// on.
func readOpenAIStream(body io.Reader, contentType string, onText, onID func(string)) ([]byte, error) {
	limited := &io.LimitedReader{R: body, N: responseMax + 1}
	if mt, _, _ := mime.ParseMediaType(contentType); mt == "application/json" {
		raw, err := io.ReadAll(limited)
		if err != nil {
			return nil, fmt.Errorf("%w: reading response: %w", provider.ErrOutcomeUnknown, err)
		}
		if limited.N <= 0 {
			return nil, &errMalformedStream{fmt.Errorf("larger than %d bytes", responseMax)}
		}
		return raw, nil
	}
	var (
		text, refusal       strings.Builder
		sawContent, sawRefl bool
		sawChoice, finished bool
		done                bool
		calls               []*streamedCall
		usage               json.RawMessage
		data                bytes.Buffer
	)
	handle := func(payload []byte) error {
		if bytes.Equal(bytes.TrimSpace(payload), []byte("[DONE]")) {
			done = true
			return nil
		}
		var c openAIChunk
		if err := decodeObject(payload, &c); err != nil {
			return &errMalformedStream{fmt.Errorf("chunk: %w", err)}
		}
		if c.ID != "" && onID != nil {
			onID(c.ID)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			// The server's error, as a non-streamed body would carry it.
			return &errMalformedStream{fmt.Errorf("server reported an error: %s", excerpt(c.Error))}
		}
		if len(c.Usage) > 0 && string(c.Usage) != "null" {
			usage = c.Usage
		}
		if len(c.Choices) == 0 {
			return nil
		}
		sawChoice = true
		ch := c.Choices[0]
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			finished = true
		}
		d := ch.Delta
		if d == nil {
			return nil
		}
		if d.Content != nil {
			sawContent = true
			text.WriteString(*d.Content)
			if onText != nil && *d.Content != "" {
				onText(*d.Content)
			}
		}
		if d.Refusal != nil {
			sawRefl = true
			refusal.WriteString(*d.Refusal)
		}
		for _, tc := range d.ToolCalls {
			if tc.Index == nil || *tc.Index < 0 || *tc.Index > len(calls) {
				return &errMalformedStream{fmt.Errorf("tool call fragment with index %v out of order", tc.Index)}
			}
			if *tc.Index == len(calls) {
				calls = append(calls, &streamedCall{})
			}
			sc := calls[*tc.Index]
			sc.ID += tc.ID
			sc.Type = cmp.Or(tc.Type, sc.Type)
			if tc.Function != nil {
				sc.Name += tc.Function.Name
				sc.Arguments.WriteString(tc.Function.Arguments)
				sc.seenArguments = true
			}
		}
		return nil
	}

	r := bufio.NewReaderSize(limited, 64<<10)
	for !done {
		line, err := r.ReadBytes('\n')
		if limited.N <= 0 {
			return nil, &errMalformedStream{fmt.Errorf("larger than %d bytes", responseMax)}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: reading stream: %w", provider.ErrOutcomeUnknown, err)
		}
		eof := err != nil
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			// An event ends at a blank line (and at the end of the body).
			if data.Len() > 0 {
				if herr := handle(data.Bytes()); herr != nil {
					return nil, herr
				}
				data.Reset()
			}
		case line[0] == ':':
			// A comment (keep-alive).
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			if string(field) == "data" {
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.Write(value)
			}
		}
		if eof {
			if data.Len() > 0 && !done {
				if herr := handle(data.Bytes()); herr != nil {
					return nil, herr
				}
			}
			break
		}
	}
	if !done && !finished {
		return nil, fmt.Errorf("%w: the stream ended before the answer did (no [DONE], no finish_reason)", provider.ErrOutcomeUnknown)
	}
	if !sawChoice {
		return nil, &errMalformedStream{errors.New("the stream carried no choice")}
	}

	// The answer, as the non-streamed body would have held it.
	type fn struct {
		Name      string  `json:"name"`
		Arguments *string `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type,omitempty"`
		Function fn     `json:"function"`
	}
	msg := struct {
		Content   *string `json:"content"`
		Refusal   *string `json:"refusal,omitempty"`
		ToolCalls []call  `json:"tool_calls,omitempty"`
	}{}
	if sawContent || (len(calls) == 0 && !sawRefl) {
		msg.Content = new(text.String())
	}
	if sawRefl {
		msg.Refusal = new(refusal.String())
	}
	for _, sc := range calls {
		c := call{ID: sc.ID, Type: sc.Type, Function: fn{Name: sc.Name}}
		if sc.seenArguments {
			c.Function.Arguments = new(sc.Arguments.String())
		}
		msg.ToolCalls = append(msg.ToolCalls, c)
	}
	out := map[string]any{"choices": []any{map[string]any{"message": msg}}}
	if usage != nil {
		out["usage"] = usage
	}
	return json.Marshal(out)
}
