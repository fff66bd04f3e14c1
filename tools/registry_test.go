package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/tools"
)

// fakeTool is a tool whose spec a test chooses.
type fakeTool struct{ spec tools.Spec }

func (f fakeTool) Spec() tools.Spec { return f.spec }
func (f fakeTool) Run(context.Context, tools.Call) (tools.Result, error) {
	return tools.Result{Output: "ran"}, nil
}

const objectSchema = `{"type": "object"}`

func fake(name string) fakeTool {
	return fakeTool{spec: tools.Spec{Name: name, InputSchema: json.RawMessage(objectSchema), Class: tools.Idempotent}}
}

func TestRegistryRegister(t *testing.T) {
	t.Parallel()

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		r := tools.NewRegistry()
		require.NoError(t, r.Register(fake("a_B-9")))
		got, ok := r.Lookup("a_B-9")
		require.True(t, ok)
		require.Equal(t, "a_B-9", got.Spec().Name)
		_, ok = r.Lookup("other")
		require.False(t, ok)
	})

	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		r := tools.NewRegistry()
		require.NoError(t, r.Register(tools.NewEcho()))
		err := r.Register(tools.NewEcho())
		require.ErrorIs(t, err, tools.ErrDuplicateTool)
		require.ErrorContains(t, err, `"echo"`)
	})

	t.Run("VersionMovesWithEachRegistration", func(t *testing.T) {
		t.Parallel()
		r := tools.NewRegistry()
		require.Zero(t, r.Version())
		require.NoError(t, r.Register(fake("a")))
		require.EqualValues(t, 1, r.Version())
		require.Error(t, r.Register(fake("a")))
		require.Error(t, r.Register(fake("")))
		require.EqualValues(t, 1, r.Version(), "a refused registration changes nothing")
		require.NoError(t, r.Register(fake("b")))
		require.EqualValues(t, 2, r.Version())
	})

	t.Run("EmptyName", func(t *testing.T) {
		t.Parallel()
		require.ErrorContains(t, tools.NewRegistry().Register(fake("")), "empty name")
	})

	t.Run("BadName", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"has space", "dot.name", "slash/name", "ünï", strings.Repeat("a", 65), "a\n"} {
			err := tools.NewRegistry().Register(fake(name))
			require.Error(t, err, name)
			require.ErrorContains(t, err, "name must match", name)
		}
		require.NoError(t, tools.NewRegistry().Register(fake(strings.Repeat("a", 64))))
	})

	t.Run("BadSchema", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ schema, problem string }{
			{``, "empty"},
			{`{"type": "object"`, "not JSON"},
			{`{"type": "object"} {}`, "not JSON"},
			{`[]`, `"type": "object"`},
			{`{"type": "string"}`, `"type": "object"`},
			{`{"properties": {}}`, `"type": "object"`},
			{`{"type": "object", "properties": {"a": {"type": "strin"}}}`, "metaschema"},
			{`{"type": "object", "properties": {"a": {"pattern": "("}}}`, "not valid regex"},
			{`{"type": "object", "$ref": "file:///etc/passwd"}`, "no URLLoader"},
			{`{"type": "object", "$ref": "https://example.com/s.json"}`, "no URLLoader"},
			{`{"type": "object", "$ref": "#/$defs/missing"}`, "not found"},
		} {
			tool := fake("bad")
			tool.spec.InputSchema = json.RawMessage(tc.schema)
			err := tools.NewRegistry().Register(tool)
			require.Error(t, err, tc.schema)
			require.ErrorContains(t, err, `tool "bad"`, tc.schema)
			require.ErrorContains(t, err, tc.problem, tc.schema)
		}
	})

	t.Run("UnknownClass", func(t *testing.T) {
		t.Parallel()
		for _, class := range []tools.Class{"", "maybe", "Idempotent"} {
			tool := fake("classy")
			tool.spec.Class = class
			err := tools.NewRegistry().Register(tool)
			require.ErrorContains(t, err, "unknown class", class)
			require.ErrorContains(t, err, `"classy"`)
		}
	})

	t.Run("NilTool", func(t *testing.T) {
		t.Parallel()
		require.Error(t, tools.NewRegistry().Register(nil))
	})

	t.Run("SpecReadOnce", func(t *testing.T) {
		t.Parallel()
		schema := []byte(`{"type": "object", "required": ["a"]}`)
		tool := fake("once")
		tool.spec.InputSchema = schema
		r := tools.NewRegistry()
		require.NoError(t, r.Register(tool))
		copy(schema, `{"type": "string"  ,"x":1}`) // the caller's bytes change afterwards
		require.Equal(t, `{"type": "object", "required": ["a"]}`, string(r.Specs()[0].InputSchema))
		require.Error(t, r.Validate("once", json.RawMessage(`{}`)))
	})
}

func TestRegistryValidate(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *tools.Registry {
		t.Helper()
		r := tools.NewRegistry()
		require.NoError(t, r.Register(tools.NewEcho()))
		return r
	}
	inputError := func(t *testing.T, err error) *tools.InputError {
		t.Helper()
		var ie *tools.InputError
		require.ErrorAs(t, err, &ie)
		require.LessOrEqual(t, len(ie.Reason), 1024)
		return ie
	}

	t.Run("UnknownTool", func(t *testing.T) {
		t.Parallel()
		err := setup(t).Validate("nope", json.RawMessage(`{"text": "x"}`))
		ie := inputError(t, err)
		require.Equal(t, "nope", ie.Tool)
		require.Equal(t, "unknown tool", ie.Reason)
		require.Equal(t, `invalid call of tool "nope": unknown tool`, err.Error())
	})

	t.Run("BadJSON", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		for _, in := range []string{``, `  `, `{`, `{"text": "x"} {}`, `{"text": 'x'}`, "\xff"} {
			ie := inputError(t, r.Validate("echo", json.RawMessage(in)))
			require.Equal(t, "echo", ie.Tool)
			require.Contains(t, ie.Reason, "invalid JSON", in)
		}
	})

	t.Run("SchemaMismatch", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		for in, want := range map[string]string{
			`{}`:                    "missing property 'text'",
			`{"text": 1}`:           "got number, want string",
			`{"text": "a", "x": 1}`: "additional properties 'x' not allowed",
			`"text"`:                "got string, want object",
			`null`:                  "got null, want object",
		} {
			ie := inputError(t, r.Validate("echo", json.RawMessage(in)))
			require.Equal(t, "echo", ie.Tool)
			require.Contains(t, ie.Reason, want, in)
			require.Contains(t, ie.Reason, "tool:echo", in)
		}
	})

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, setup(t).Validate("echo", json.RawMessage(` {"text": "héllo"} `)))
	})

	t.Run("ReasonBounded", func(t *testing.T) {
		t.Parallel()
		var b strings.Builder
		b.WriteString(`{"text": "x"`)
		for i := range 500 {
			fmt.Fprintf(&b, `, "extra_property_number_%d": 1`, i)
		}
		b.WriteString(`}`)
		ie := inputError(t, setup(t).Validate("echo", json.RawMessage(b.String())))
		require.Len(t, ie.Reason, 1024)
		require.True(t, strings.HasSuffix(ie.Reason, "…[truncated]"), ie.Reason)
		require.Contains(t, ie.Reason, "additional properties")
	})

	t.Run("UnknownToolNameBounded", func(t *testing.T) {
		t.Parallel()
		ie := inputError(t, setup(t).Validate(strings.Repeat("n", 10000), json.RawMessage(`{}`)))
		require.LessOrEqual(t, len(ie.Tool), 128)
	})
}

func TestRegistrySpecs(t *testing.T) {
	t.Parallel()

	r := tools.NewRegistry()
	require.Empty(t, r.Specs())
	for _, name := range []string{"zeta", "Alpha", "mid", "alpha", "_x", "9"} {
		require.NoError(t, r.Register(fake(name)))
	}
	names := func(specs []tools.Spec) []string {
		out := make([]string, len(specs))
		for i, s := range specs {
			out[i] = s.Name
		}
		return out
	}
	want := []string{"9", "Alpha", "_x", "alpha", "mid", "zeta"} // byte order
	first := r.Specs()
	require.Equal(t, want, names(first))
	for range 20 {
		require.Equal(t, want, names(r.Specs()))
	}

	// A caller's changes do not reach the registry.
	first[0].Name = "changed"
	first[0].InputSchema[0] = 'X'
	again := r.Specs()
	require.Equal(t, "9", again[0].Name)
	require.JSONEq(t, objectSchema, string(again[0].InputSchema))
}

func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()

	r := tools.NewRegistry()
	require.NoError(t, r.Register(tools.NewEcho()))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Go(func() {
			if err := r.Register(fake(fmt.Sprintf("t%d", i))); err != nil {
				errs <- err
			}
		})
		wg.Go(func() {
			for range 50 {
				if err := r.Validate("echo", json.RawMessage(`{"text": "x"}`)); err != nil {
					errs <- err
				}
				if err := r.Validate("echo", json.RawMessage(`{}`)); err == nil {
					errs <- errors.New("invalid input accepted")
				}
				r.Lookup("echo")
				r.Specs()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, r.Specs(), 9)
}

// resolverTool decides its class per input.
type resolverTool struct {
	fakeTool
	class tools.Class
}

func (r resolverTool) ClassOf(json.RawMessage) tools.Class { return r.class }

func TestResolveClass(t *testing.T) {
	t.Parallel()

	in := json.RawMessage(`{}`)
	require.Equal(t, tools.Idempotent, tools.ResolveClass(tools.NewEcho(), in))
	require.Equal(t, tools.SideEffecting, tools.ResolveClass(tools.NewAppendLine(t.TempDir()), in))

	noClass := fake("x")
	noClass.spec.Class = "bogus"
	require.Equal(t, tools.SideEffecting, tools.ResolveClass(noClass, in))

	require.Equal(t, tools.Idempotent, tools.ResolveClass(resolverTool{fake("r"), tools.Idempotent}, in))
	require.Equal(t, tools.SideEffecting, tools.ResolveClass(resolverTool{fake("r"), tools.SideEffecting}, in))
	require.Equal(t, tools.SideEffecting, tools.ResolveClass(resolverTool{fake("r"), ""}, in))
}

func TestParseClass(t *testing.T) {
	t.Parallel()

	for _, c := range []tools.Class{tools.Idempotent, tools.SideEffecting} {
		got, err := tools.ParseClass(string(c))
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	for _, s := range []string{"", "IDEMPOTENT", "side-effecting", "unknown"} {
		_, err := tools.ParseClass(s)
		require.Error(t, err, s)
	}
}

func TestParsePermission(t *testing.T) {
	t.Parallel()

	for s, want := range map[string]tools.Permission{"allow": tools.Allow, "deny": tools.Deny, "ask": tools.Ask} {
		got, err := tools.ParsePermission(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, s := range []string{"", "Allow", "yes", " ask"} {
		_, err := tools.ParsePermission(s)
		require.ErrorContains(t, err, "unknown permission", s)
	}
}
