package envelope_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// A record of the events topic that is not a session event (a prompt
// published there by mistake, an empty object) is refused, not returned
// as an event with no id and no type: a watcher counting events would
// count it, and its empty id escapes deduplication.
func TestDecodeEventRefusesWhatIsNoEvent(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ value, want string }{
		"Prompt": {`{"message_id":"m-1","session_id":"s-1","text":"hi"}`, "no id"},
		"Empty":  {`{}`, "no id"},
		"NoType": {`{"id":"turn.completed:m-1","session_id":"s-1"}`, "no type"},
	} {
		_, err := envelope.DecodeEvent([]byte(tc.value))
		require.ErrorContains(t, err, tc.want, name)
	}
	e, err := envelope.DecodeEvent([]byte(`{"id":"turn.completed:m-1","type":"turn.completed","session_id":"s-1"}`))
	require.NoError(t, err)
	require.Equal(t, envelope.Event{ID: "turn.completed:m-1", Type: "turn.completed", SessionID: "s-1"}, e)
}
