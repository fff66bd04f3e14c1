package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/promptline/promptline/tools"
)

// shout is a custom tool: it has no side effect, so it is Idempotent.
type shout struct{}

func (shout) Spec() tools.Spec {
	return tools.Spec{
		Name:        "shout",
		Description: "Returns the text in capitals.",
		InputSchema: json.RawMessage(`{
			"type": "object",
			"properties": {"text": {"type": "string"}},
			"required": ["text"],
			"additionalProperties": false
		}`),
		Class: tools.Idempotent,
	}
}

func (shout) Run(_ context.Context, call tools.Call) (tools.Result, error) {
	var in struct{ Text string }
	if err := json.Unmarshal(call.Input, &in); err != nil {
		return tools.Result{IsError: true, Output: err.Error()}, nil
	}
	return tools.Result{Output: strings.ToUpper(in.Text)}, nil
}

func ExampleRegistry() {
	reg := tools.NewRegistry()
	for _, t := range []tools.Tool{shout{}, tools.NewEcho()} {
		if err := reg.Register(t); err != nil {
			panic(err)
		}
	}
	for _, s := range reg.Specs() {
		fmt.Println(s.Name, s.Class)
	}

	// What the executor does with a call the model requests.
	input := json.RawMessage(`{"text": "hello"}`)
	if err := reg.Validate("shout", input); err != nil {
		panic(err)
	}
	tool, _ := reg.Lookup("shout")
	res, err := tool.Run(context.Background(), tools.Call{ID: "call-1", Name: "shout", Input: input})
	fmt.Println(res.Output, res.IsError, err)

	// A bad input is a failed call for the model, not a crash.
	var ie *tools.InputError
	err = reg.Validate("shout", json.RawMessage(`{"txt": "hello"}`))
	fmt.Println(errors.As(err, &ie), ie.Tool)
	// Output:
	// echo idempotent
	// shout idempotent
	// HELLO false <nil>
	// true shout
}
