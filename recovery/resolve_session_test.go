package recovery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// A finding about a session that does not exist is refused by the
// session lock, before any target is read, and writes nothing.
func TestResolveRefusesAMissingSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.resolve(t, "nobody", "call-1", recovery.FindingDidNotRun, "")
	require.EqualError(t, err, "session nobody: no such session")
	require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM sessions`), "the refusal creates no session")
}
