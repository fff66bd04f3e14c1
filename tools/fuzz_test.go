package tools_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/promptline/promptline/tools"
)

// FuzzValidate feeds the validator what a model may send: any tool name, any
// bytes. It must never panic, and every failure must be a bounded
// *InputError. ClassOf must always answer a known class.
func FuzzValidate(f *testing.F) {
	reg := tools.NewRegistry()
	httpTool, err := tools.NewHTTPRequest(nil, []tools.Endpoint{
		{Name: "read", URL: "http://127.0.0.1:1/r", Class: tools.Idempotent},
		{Name: "write", URL: "http://127.0.0.1:1/w"},
	})
	if err != nil {
		f.Fatal(err)
	}
	for _, tool := range []tools.Tool{tools.NewEcho(), tools.NewAppendLine(f.TempDir()), httpTool} {
		if err := reg.Register(tool); err != nil {
			f.Fatal(err)
		}
	}

	for _, seed := range []struct{ name, input string }{
		{"echo", `{"text": "hi"}`},
		{"echo", `{}`},
		{"echo", `{"text": "\ud800"}`},
		{"echo", ``},
		{"echo", `{"text": "a"} trailing`},
		{"echo", `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`},
		{"echo", `{"text": 1e400}`},
		{"append_line", `{"file": "../x", "line": "l"}`},
		{"append_line", `{"file": "log", "line": "a\nb"}`},
		{"http_request", `{"endpoint": "read", "body": {"deep": [1, {"x": null}]}}`},
		{"http_request", `{"endpoint": "nope"}`},
		{"unknown", `{}`},
		{"", "\x00\xff"},
	} {
		f.Add(seed.name, []byte(seed.input))
	}

	f.Fuzz(func(t *testing.T, name string, input []byte) {
		err := reg.Validate(name, json.RawMessage(input))
		if err != nil {
			var ie *tools.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("Validate(%q, %q) = %T %v, want *InputError", name, input, err, err)
			}
			if len(ie.Reason) > 1024 {
				t.Fatalf("reason is %d bytes", len(ie.Reason))
			}
		} else if !json.Valid(input) {
			t.Fatalf("Validate accepted invalid JSON %q", input)
		}
		if c := tools.ResolveClass(httpTool, json.RawMessage(input)); c != tools.Idempotent && c != tools.SideEffecting {
			t.Fatalf("ClassOf(%q) = %q", input, c)
		}
	})
}
