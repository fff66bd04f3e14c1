package testkit

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/promptline/promptline/envelope"
)

// The published schemas, compiled once per test binary: a compiled schema
// only reads itself while it validates, so parallel tests share it. The
// embedded copies in envelope are the canonical ones; docs/ holds
// byte-identical copies, which envelope's tests keep from drifting.
var (
	eventSchema = sync.OnceValues(func() (*jsonschema.Schema, error) {
		return compileSchema("session-event.schema.json", envelope.EventSchema)
	})
	deltaSchema = sync.OnceValues(func() (*jsonschema.Schema, error) {
		return compileSchema("session-delta.schema.json", envelope.DeltaSchema)
	})
)

// EventSchema returns the published session-event schema, formats
// asserted as a strict consumer would.
func EventSchema(tb testing.TB) *jsonschema.Schema {
	tb.Helper()
	s, err := eventSchema()
	must(tb, err)
	return s
}

// DeltaSchema returns the published schema of a live text delta
// (session-deltas), formats asserted as a strict consumer would.
func DeltaSchema(tb testing.TB) *jsonschema.Schema {
	tb.Helper()
	s, err := deltaSchema()
	must(tb, err)
	return s
}

// RequireValid fails the test unless doc is one JSON document that s
// accepts; the failure shows the document.
func RequireValid(tb testing.TB, s *jsonschema.Schema, doc []byte) {
	tb.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		tb.Fatalf("not one JSON document: %v\n%s", err, doc)
	}
	if err := s.Validate(v); err != nil {
		tb.Fatalf("%v\n%s", err, doc)
	}
}

func compileSchema(name string, schema []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(name, doc); err != nil {
		return nil, fmt.Errorf("adding %s: %w", name, err)
	}
	s, err := c.Compile(name)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", name, err)
	}
	return s, nil
}
