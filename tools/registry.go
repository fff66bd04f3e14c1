package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ErrDuplicateTool is returned by Register for a name already registered.
var ErrDuplicateTool = errors.New("tool already registered")

// maxReason bounds InputError.Reason: it goes back to the model.
const maxReason = 1 << 10

// namePattern is the rule of OpenAI function names, which the other model
// APIs accept too.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// Registry holds the tools the model may call, by name. Register them at
// start-up; lookups and validation are safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	tools   map[string]registered
	version uint64 // registrations so far: see Version
}

type registered struct {
	tool   Tool
	spec   Spec // as read once at registration
	schema *jsonschema.Schema
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{tools: map[string]registered{}}
}

// Register adds t under t.Spec().Name. It rejects an empty name or one that
// does not match ^[a-zA-Z0-9_-]{1,64}$, a name already registered
// (ErrDuplicateTool), a class other than Idempotent or SideEffecting, and
// an input schema that does not compile or does not describe an object.
// The error names the tool and the problem.
func (r *Registry) Register(t Tool) error {
	if t == nil {
		return errors.New("registering tool: nil Tool")
	}
	spec := t.Spec()
	spec.InputSchema = bytes.Clone(spec.InputSchema)
	if spec.Name == "" {
		return errors.New("registering tool: empty name")
	}
	if !namePattern.MatchString(spec.Name) {
		return fmt.Errorf("registering tool %q: name must match %s", spec.Name, namePattern)
	}
	if !spec.Class.valid() {
		return fmt.Errorf("registering tool %q: unknown class %q (want %q or %q)", spec.Name, spec.Class, Idempotent, SideEffecting)
	}
	schema, err := compileSchema(spec.Name, spec.InputSchema)
	if err != nil {
		return fmt.Errorf("registering tool %q: input schema: %w", spec.Name, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tools[spec.Name]; ok {
		return fmt.Errorf("registering tool %q: %w", spec.Name, ErrDuplicateTool)
	}
	r.tools[spec.Name] = registered{tool: t, spec: spec, schema: schema}
	r.version++
	return nil
}

// Version counts the registrations so far: what Specs returns changes only
// when it moves, so a caller may keep something built from Specs until
// then (the executor keeps the provider's form of them, one for all its
// requests, instead of a copy per request).
func (r *Registry) Version() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.version
}

// compileSchema compiles a tool's input schema on its own: no loader is
// set, so a $ref to a file or a URL fails instead of reading it.
func compileSchema(name string, raw json.RawMessage) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	obj, ok := doc.(map[string]any)
	if !ok || obj["type"] != "object" {
		return nil, errors.New(`must be a JSON object with "type": "object"`)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{})
	loc := "tool:" + name // names a mismatch in the validator's messages
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	return c.Compile(loc)
}

// Lookup returns the tool registered under name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	reg, ok := r.tools[name]
	return reg.tool, ok
}

// Specs returns the specs of all tools, sorted by name, as read at
// registration. The caller may modify them.
func (r *Registry) Specs() []Spec {
	r.mu.RLock()
	specs := make([]Spec, 0, len(r.tools))
	for _, reg := range r.tools {
		s := reg.spec
		s.InputSchema = bytes.Clone(s.InputSchema)
		specs = append(specs, s)
	}
	r.mu.RUnlock()
	slices.SortFunc(specs, func(a, b Spec) int { return strings.Compare(a.Name, b.Name) })
	return specs
}

// Validate checks a call's input against the tool's schema. Every failure is
// an *InputError: the tool is unknown, the input is not one JSON value, or
// it does not match the schema (Reason is the validator's message, bounded
// to 1 KiB).
func (r *Registry) Validate(name string, input json.RawMessage) error {
	r.mu.RLock()
	reg, ok := r.tools[name]
	r.mu.RUnlock()
	if !ok {
		return &InputError{Tool: bound(name, 128), Reason: "unknown tool"}
	}
	if len(bytes.TrimSpace(input)) == 0 {
		return &InputError{Tool: name, Reason: "invalid JSON: empty input"}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(input))
	if err != nil {
		return &InputError{Tool: name, Reason: bound("invalid JSON: "+err.Error(), maxReason)}
	}
	if err := reg.schema.Validate(inst); err != nil {
		return &InputError{Tool: name, Reason: bound(err.Error(), maxReason)}
	}
	return nil
}
