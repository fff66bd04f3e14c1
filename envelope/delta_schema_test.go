package envelope_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// TestDeltaSchema: what the executor publishes on session-deltas
// (envelope.Delta) is what the schema describes, and the schema refuses a
// delta a UI could not place.
func TestDeltaSchema(t *testing.T) {
	t.Parallel()

	sch := compileSchema(t, envelope.DeltaSchema)
	d := envelope.Delta{SessionID: "s1", TurnID: "a1", AssistantMessageID: "a2", Step: 2, Seq: 1, Text: "Hel",
		At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	b, err := json.Marshal(d)
	require.NoError(t, err)
	ok, err := schemaAccepts(sch, b)
	require.NoError(t, err)
	require.True(t, ok)

	for name, value := range map[string]string{
		"MissingSeq":  `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":1,"text":"x","at":"2026-01-02T03:04:05Z"}`,
		"SeqZero":     `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":1,"seq":0,"text":"x","at":"2026-01-02T03:04:05Z"}`,
		"StepZero":    `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":0,"seq":1,"text":"x","at":"2026-01-02T03:04:05Z"}`,
		"EmptyText":   `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":1,"seq":1,"text":"","at":"2026-01-02T03:04:05Z"}`,
		"NoTurn":      `{"session_id":"s1","assistant_message_id":"a2","step":1,"seq":1,"text":"x","at":"2026-01-02T03:04:05Z"}`,
		"BadAt":       `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":1,"seq":1,"text":"x","at":"yesterday"}`,
		"SeqFraction": `{"session_id":"s1","turn_id":"a1","assistant_message_id":"a2","step":1,"seq":1.5,"text":"x","at":"2026-01-02T03:04:05Z"}`,
	} {
		t.Run(name, func(t *testing.T) {
			ok, err := schemaAccepts(sch, []byte(value))
			require.Error(t, err)
			require.False(t, ok)
		})
	}
}
