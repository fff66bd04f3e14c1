package executor_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// TestTurnFailedLogsNoPromptText: the scripted provider's error is made of
// the prompt (as real providers' 4xx bodies often echo the input). At the
// default level the logs carry the failure's class, never its text; at
// debug the text may be logged.
func TestTurnFailedLogsNoPromptText(t *testing.T) {
	t.Parallel()
	const secret = "the-prompt-text-4711"
	for _, tc := range []struct {
		level    slog.Level
		wantText bool
	}{
		{slog.LevelInfo, false},
		{slog.LevelDebug, true},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			logs := testkit.NewSyncBuffer()
			log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: tc.level}))
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a", Logger: log})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Logger: log})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", "/fail "+secret)
			done, err := e.Wake(context.Background(), "s", 0)
			require.NoError(t, err)
			wait(t, done)

			var failed map[string]any
			for l := range strings.Lines(logs.String()) {
				var line map[string]any
				require.NoError(t, json.Unmarshal([]byte(l), &line), l)
				if line["msg"] == "turn failed" {
					failed = line
				}
			}
			require.NotNil(t, failed, "no turn failed line in:\n%s", logs.String())
			require.Equal(t, "provider_error", failed["reason"])
			require.Equal(t, "s", failed["session_id"])
			require.Equal(t, tc.wantText, strings.Contains(logs.String(), secret), logs.String())
			require.NotEmpty(t, failed["error_class"])
		})
	}
}
