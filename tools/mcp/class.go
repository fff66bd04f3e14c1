package mcp

import (
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/promptline/promptline/tools"
)

// ClassOf is the class promptline gives a tool from its annotations:
// Idempotent when readOnlyHint is true, or when idempotentHint is true and
// destructiveHint is false; SideEffecting otherwise. A missing
// destructiveHint counts as true, the protocol's default, and a tool
// without annotations is SideEffecting: only a declared promise makes a
// call safe to repeat.
func ClassOf(a *mcp.ToolAnnotations) tools.Class {
	switch {
	case a == nil:
		return tools.SideEffecting
	case a.ReadOnlyHint:
		return tools.Idempotent
	case a.IdempotentHint && a.DestructiveHint != nil && !*a.DestructiveHint:
		return tools.Idempotent
	}
	return tools.SideEffecting
}

// Override is an operator's class for one tool (--tool-class).
type Override struct {
	// Class replaces the class read from the annotations.
	Class tools.Class
	// Force allows Class to be less strict than the annotations' class
	// (idempotent for a tool they make side_effecting): the operator
	// vouches that the server deduplicates on the idempotency key.
	Force bool
}

// ParseOverride reads NAME=CLASS or NAME=CLASS! (the "!" is Force). NAME
// is the tool's name as the model sees it, SERVER__TOOL, or SERVER.TOOL.
func ParseOverride(v string) (string, Override, error) {
	name, class, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return "", Override{}, fmt.Errorf("want SERVER.TOOL=side_effecting|idempotent[!], got %q", v)
	}
	var o Override
	class, o.Force = strings.CutSuffix(class, "!")
	c, err := tools.ParseClass(class)
	if err != nil {
		return "", Override{}, fmt.Errorf("%s: %w", name, err)
	}
	o.Class = c
	return CanonicalName(name), o, nil
}

// apply returns the class of a tool whose annotations give declared.
func (o Override) apply(name string, declared tools.Class) (tools.Class, error) {
	if o.Class == tools.Idempotent && declared == tools.SideEffecting && !o.Force {
		return "", fmt.Errorf("--tool-class %s=idempotent would make a side_effecting tool (by its annotations) repeatable after a crash; write %s=idempotent! if the server deduplicates on the idempotency key", name, name)
	}
	return o.Class, nil
}

// nameSep joins a server's name and a tool's: the model APIs allow no dot
// in a function name.
const nameSep = "__"

// ToolName is the name the model sees for a server's tool.
func ToolName(server, tool string) string { return server + nameSep + tool }

// CanonicalName turns SERVER.TOOL, the operator's spelling, into
// SERVER__TOOL; any other name is returned as it is. No built-in tool name
// holds a dot, so a dotted name can only mean an MCP tool.
func CanonicalName(name string) string {
	server, tool, ok := strings.Cut(name, ".")
	if !ok || !serverNamePattern.MatchString(server) || tool == "" {
		return name
	}
	return ToolName(server, tool)
}
