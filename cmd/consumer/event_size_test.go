package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// The events a consumer writes are cut to its --max-message-bytes, not to
// the relay's default: an answer larger than the flag allows, smaller than
// the default, was quarantined.
func TestEventsFitMaxMessageBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, "c1", "", "--max-message-bytes", "100000")
	answer := strings.Repeat("x", 150_000)
	b.send(t, envelope.Prompt{MessageID: "m-large", SessionID: "s-large", Text: "/reply " + answer})
	ev := b.events.waitTurn(t, "m-large")
	require.Equal(t, envelope.EventTurnCompleted, ev.Type)
	require.True(t, ev.Truncated)
	require.True(t, strings.HasPrefix(answer, ev.Text))
	require.Greater(t, len(ev.Text), 90_000)
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL`))
}
