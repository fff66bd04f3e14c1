package envelope_test

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// TestSessionEventsDocExamples reads every example event of
// docs/session-events.md (a one-line JSON block with a "type") and
// checks that it is what promptline writes: the example decoded into
// envelope.Event and encoded again, as the outbox does, gives the same
// bytes. A reader who copies an example, or compares a record with it,
// sees promptline's members, spelled and ordered as promptline writes
// them, and none that it never writes.
func TestSessionEventsDocExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/session-events.md")
	require.NoError(t, err)
	examples := regexp.MustCompile("(?m)^```json\n(\\{\"id\":.*\\})\n```$").FindAllSubmatch(doc, -1)
	require.GreaterOrEqual(t, len(examples), 6, "the examples of docs/session-events.md")
	for _, m := range examples {
		example := string(m[1])
		e, err := envelope.DecodeEvent([]byte(example))
		require.NoError(t, err, example)
		got, err := json.Marshal(e)
		require.NoError(t, err)
		require.Equal(t, example, string(got), "docs/session-events.md example of %s", e.Type)
	}
}
