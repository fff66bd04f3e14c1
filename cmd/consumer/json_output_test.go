package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// TestRecoverJSONKeys runs `consumer recover --json` on a migrated
// database and reads the keys of what it prints, as a script would: the
// pass's counts under snake_case keys, like every JSON output of the
// operator commands (`recovery apply --json`'s "decisions", "skipped",
// ...), never the names of a Go struct's fields.
func TestRecoverJSONKeys(t *testing.T) {
	t.Parallel()
	_, dbURL := testkit.Pool(t)
	out, stderr, code := runOnce(t, "recover", "--json", "--database-url", dbURL)
	require.Zero(t, code, "consumer recover --json: %s", stderr)
	var got map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	require.ElementsMatch(t, []string{"decisions", "skipped", "failed", "retried", "redriven"}, keys, out)
	require.JSONEq(t, `{}`, string(got["decisions"]), out)
}

// TestRecoveryExplainJSONNoDecisions runs `consumer recovery explain
// --json` for a session no recovery decided on: an empty array, as
// `quarantine list --json` prints for no rows, never null (`jq '.[]'`
// fails on null).
func TestRecoveryExplainJSONNoDecisions(t *testing.T) {
	t.Parallel()
	_, dbURL := testkit.Pool(t)
	out, stderr, code := runOnce(t, "recovery", "explain", "s-never-recovered", "--json", "--database-url", dbURL)
	require.Zero(t, code, "consumer recovery explain --json: %s", stderr)
	require.JSONEq(t, `[]`, out)
}
