package tools_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/tools"
)

func TestEcho(t *testing.T) {
	t.Parallel()

	echo := tools.NewEcho()
	spec := echo.Spec()
	require.Equal(t, "echo", spec.Name)
	require.Equal(t, tools.Idempotent, spec.Class)
	r := tools.NewRegistry()
	require.NoError(t, r.Register(echo))

	t.Run("ReturnsText", func(t *testing.T) {
		t.Parallel()
		for _, text := range []string{"hello", "", "multi\nline ünïcode"} {
			in, err := json.Marshal(map[string]string{"text": text})
			require.NoError(t, err)
			require.NoError(t, r.Validate("echo", in))
			res, err := echo.Run(context.Background(), tools.Call{ID: "c1", Name: "echo", Input: in})
			require.NoError(t, err)
			require.Equal(t, tools.Result{Output: text}, res)
		}
	})

	t.Run("InvalidInputIsCleanFailure", func(t *testing.T) {
		t.Parallel()
		for _, in := range []string{`{}`, `{"text": 1}`, `nope`} {
			res, err := echo.Run(context.Background(), tools.Call{Name: "echo", Input: json.RawMessage(in)})
			require.NoError(t, err, in)
			require.True(t, res.IsError, in)
		}
	})
}
