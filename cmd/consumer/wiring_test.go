package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/pipeline"
	"github.com/promptline/promptline/recovery"
)

// TestRunWiresEveryCallback: every OnXxx callback of the services' configs
// is set where run builds that config, so a callback added to a service
// (the way metrics are fed: metrics/doc.go) cannot go unwired; those left
// unset on purpose are listed with why. It reads run.go's composite
// literals for the fields they set, and reflects on the config types for
// the callbacks they have.
func TestRunWiresEveryCallback(t *testing.T) {
	t.Parallel()
	configs := map[string]reflect.Type{
		"outbox.RelayConfig":            reflect.TypeFor[outbox.RelayConfig](),
		"outbox.PrunerConfig":           reflect.TypeFor[outbox.PrunerConfig](),
		"ledger.PrunerConfig":           reflect.TypeFor[ledger.PrunerConfig](),
		"ledger.ClaimsConfig":           reflect.TypeFor[ledger.ClaimsConfig](),
		"admission.AdmitterConfig":      reflect.TypeFor[admission.AdmitterConfig](),
		"executor.DeltaPublisherConfig": reflect.TypeFor[executor.DeltaPublisherConfig](),
		"executor.ExecutorConfig":       reflect.TypeFor[executor.ExecutorConfig](),
		"recovery.Config":               reflect.TypeFor[recovery.Config](),
		"pipeline.ConsumerConfig":       reflect.TypeFor[pipeline.ConsumerConfig](),
	}
	unwired := map[string]string{
		"ledger.ClaimsConfig.OnPhaseFunc": "a hook for tracing and tests, run inside the write's transaction",
	}
	set := setFields(t, "run.go")
	for name, typ := range configs {
		fields, ok := set[name]
		require.True(t, ok, "run.go builds no %s{...}: is the list above stale?", name)
		for f := range typ.Fields() {
			if !strings.HasPrefix(f.Name, "On") || f.Type.Kind() != reflect.Func {
				continue
			}
			if _, ok := unwired[name+"."+f.Name]; ok {
				require.False(t, fields[f.Name], "%s.%s is wired now: drop it from the unwired list", name, f.Name)
				continue
			}
			require.True(t, fields[f.Name], "run.go builds %s without %s: wire it to its metric (or say here why not)", name, f.Name)
		}
	}
}

// setFields returns, for each composite literal pkg.Type{...} (or
// &pkg.Type{...}) in file, the fields it sets by name.
func setFields(t *testing.T, file string) map[string]map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		name := pkg.Name + "." + sel.Sel.Name
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for _, e := range lit.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok {
					out[name][k.Name] = true
				}
			}
		}
		return true
	})
	return out
}
