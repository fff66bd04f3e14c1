package executor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/tools"
)

// Every request shares one slice of the tools' specs, and a tool
// registered later is in the next request's.
func TestToolSpecsSharedUntilARegistration(t *testing.T) {
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	ex := &execution{e: &Executor{cfg: ExecutorConfig{Tools: reg}}}

	first := ex.toolSpecs()
	require.Len(t, first, 1)
	require.Equal(t, "echo", first[0].Name)
	require.JSONEq(t, string(reg.Specs()[0].InputSchema), string(first[0].InputSchema))
	again := ex.toolSpecs()
	require.Same(t, &first[0], &again[0], "one slice for every request")

	require.NoError(t, reg.Register(tools.NewAppendLine(t.TempDir())))
	after := ex.toolSpecs()
	require.Len(t, after, 2, "the tool registered later is offered")
	require.Equal(t, []string{"append_line", "echo"}, []string{after[0].Name, after[1].Name})
	require.Equal(t, "echo", first[0].Name, "the slice handed out earlier is left as it was")
	require.NotSame(t, &first[0], &after[0], "a new slice, not the old one written over")

	none := &execution{e: &Executor{}}
	require.Nil(t, none.toolSpecs())
}
