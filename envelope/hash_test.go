package envelope_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// The payload hash is stored with every admitted input: it must never
// change between versions, or an exact retry of a prompt admitted before
// an upgrade would be taken for a conflicting reuse. The vectors are
// sha256("<bytes>:<session>;<bytes>:<text>;<bytes>:<delivery>;"), checked
// with sha256sum when they were written.
func TestHashIsStable(t *testing.T) {
	t.Parallel()
	for want, p := range map[string]envelope.Prompt{
		"9f7795b47f3fb3003ab8e3342c858741b16e1da24da7892beb8c43c33a3aa048": {SessionID: "s-1", Text: "hello", Delivery: envelope.DeliveryQueue},
		"229c0c8217c50a35c8e5ea519620867e320686007419b08a63d0dd841c0b3d2a": {SessionID: "ab", Text: "c", Delivery: envelope.DeliverySteer},
		"21de821c141241cc7c1cfbc2a8fffc996b50ed7ffa4cffd9bbf4d5fde1c6be1d": {SessionID: "sess", Text: "héllo\nwörld ✓", Delivery: envelope.DeliverySteer},
	} {
		require.Equal(t, want, hex.EncodeToString(p.Hash()), "%+v", p)
	}
	// Fields far longer than the others: the hash's buffer is sized from
	// their lengths, and no length may make that size negative.
	for want, p := range map[string]envelope.Prompt{
		"de1846f750b9dc073a00059b8f4220ec6315126112d944decedfe7559b682ab2": {SessionID: "s", Text: strings.Repeat("x", 200), Delivery: envelope.DeliveryQueue},
		// Decode accepts only queue and steer, but Hash is total.
		"b2b524409f19f970c6ff399911c13419452591c59fd38869f3d29d84c517ae76": {SessionID: "s", Text: "t", Delivery: envelope.Delivery(strings.Repeat("d", 100))},
	} {
		require.Equal(t, want, hex.EncodeToString(p.Hash()), "%+v", p)
	}
	// An unset delivery hashes as queue.
	require.Equal(t, "9f7795b47f3fb3003ab8e3342c858741b16e1da24da7892beb8c43c33a3aa048",
		hex.EncodeToString(envelope.Prompt{SessionID: "s-1", Text: "hello"}.Hash()))
}

func BenchmarkHash(b *testing.B) {
	p := envelope.Prompt{SessionID: "session-0042", Text: strings.Repeat("summarise the thread ", 10), Delivery: envelope.DeliveryQueue}
	b.ReportAllocs()
	for b.Loop() {
		p.Hash()
	}
}
