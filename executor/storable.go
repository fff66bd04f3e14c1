package executor

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/promptline/promptline/provider"
)

// What the executor stores from outside — a model's answer and tool
// calls, a tool's output, an error's text — may be what Postgres refuses:
// bytes that are not UTF-8 (a tool's body in latin-1), a NUL (a model's
// "\u0000"), in text and jsonb alike, or a tool input that is not JSON.
// Refused with a data error, a result the executor holds would go
// unrecorded: the claim left to expire with the call or the attempt
// started, which recovery can only make unknown (P4), or an idempotent
// tool run again, for bad data (P6). So it is made storable first, at the
// boundary, with U+FFFD where a decoder would show one.

// storable returns s as a text column takes it: valid UTF-8 without NUL.
func storable(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storableJSON returns b as a jsonb column takes it: b itself when it is
// JSON with no NUL escaped in a string (jsonb refuses "\u0000"); its
// strings made storable when it has one; else, not being JSON, b's text as
// one JSON string (the call then fails its tool's input schema, recorded).
func storableJSON(b json.RawMessage) json.RawMessage {
	if !json.Valid(b) {
		out, _ := json.Marshal(storable(string(b))) // a string always marshals
		return out
	}
	if !bytes.Contains(b, []byte(`\u0000`)) && !escapedSurrogate.Match(b) {
		return b
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // numbers as written
	var v any
	if err := d.Decode(&v); err != nil {
		out, _ := json.Marshal(storable(string(b)))
		return out
	}
	out, err := json.Marshal(storableValue(v))
	if err != nil {
		out, _ = json.Marshal(storable(string(b)))
	}
	return out
}

// escapedSurrogate finds a \u escape of a UTF-16 surrogate, which jsonb
// refuses unless it is half of a pair, and which Go's decoder accepts
// alone (as U+FFFD): such an input is decoded and encoded again, a pair
// then written as its character. (A backslash escaped before the u makes
// a false match, which costs a decode and changes nothing.)
var escapedSurrogate = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

func storableValue(v any) any {
	switch v := v.(type) {
	case string:
		return storable(v)
	case []any:
		for i := range v {
			v[i] = storableValue(v[i])
		}
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[storable(k)] = storableValue(e)
		}
		return out
	}
	return v
}

// storableResponse makes a provider's response storable (storable,
// storableJSON): its text and each tool call's ID, name and input.
func storableResponse(r provider.Response) provider.Response {
	r.Text = storable(r.Text)
	if len(r.ToolCalls) > 0 {
		calls := make([]provider.ToolCall, len(r.ToolCalls))
		for i, c := range r.ToolCalls {
			calls[i] = provider.ToolCall{ID: storable(c.ID), Name: storable(c.Name), Input: storableJSON(c.Input)}
		}
		r.ToolCalls = calls
	}
	return r
}
