package testkit_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// TestSchemas: the published schemas compile once and are shared; an
// event or delta they accept passes, one they reject (a missing field, a
// date that is no date-time: formats are asserted) or a document that is
// not JSON fails the test, showing the document.
func TestSchemas(t *testing.T) {
	t.Parallel()
	require.Same(t, testkit.EventSchema(t), testkit.EventSchema(t), "compiled once")
	require.Same(t, testkit.DeltaSchema(t), testkit.DeltaSchema(t), "compiled once")

	fails := func(check func(testing.TB)) string {
		fatal := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			check(fatal)
		}()
		<-done
		return fatal.msg
	}
	event := `{"id":"input.admitted:m1","type":"input.admitted","session_id":"s","message_id":"m1","at":"2026-01-02T03:04:05Z"}`
	require.Empty(t, fails(func(tb testing.TB) { testkit.RequireValid(tb, testkit.EventSchema(tb), []byte(event)) }))
	for _, bad := range []string{
		`{"type":"input.admitted","session_id":"s","message_id":"m1","at":"2026-01-02T03:04:05Z"}`,
		`{"id":"input.admitted:m1","type":"input.admitted","session_id":"s","message_id":"m1","at":"yesterday"}`,
		`{"id":`,
	} {
		require.Contains(t, fails(func(tb testing.TB) { testkit.RequireValid(tb, testkit.EventSchema(tb), []byte(bad)) }), bad)
	}
	require.Contains(t, fails(func(tb testing.TB) { testkit.RequireValid(tb, testkit.DeltaSchema(tb), []byte(event)) }), event,
		"an event is no delta")
}
