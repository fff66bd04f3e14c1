package kafkautil

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// A reject is cut to its budget: the value to a prefix, the key only
// when it alone is too large; the headers say what was cut.
func TestPendingRejectTruncation(t *testing.T) {
	t.Parallel()
	headers := []sarama.RecordHeader{{Key: []byte("reason"), Value: []byte("invalid_json")}}
	sha := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	get := func(m *sarama.ProducerMessage, k string) string { return header(m, k) }

	t.Run("FitsWhole", func(t *testing.T) {
		t.Parallel()
		orig := &sarama.ProducerMessage{Key: sarama.ByteEncoder("k"), Value: sarama.ByteEncoder("v"), Headers: headers}
		m := (&pendingReject{orig: orig, budget: 1000}).message()
		require.Equal(t, "v", string(encoded(m.Value)))
		require.Equal(t, "k", string(encoded(m.Key)))
		require.Len(t, m.Headers, 1)
	})

	t.Run("ValueCut", func(t *testing.T) {
		t.Parallel()
		value := bytes.Repeat([]byte("x"), 5000)
		orig := &sarama.ProducerMessage{Key: sarama.ByteEncoder("k"), Value: sarama.ByteEncoder(value), Headers: headers}
		p := &pendingReject{orig: orig, budget: 1000}
		m := p.message()
		require.LessOrEqual(t, m.ByteSize(recordVersion), 1000)
		require.Greater(t, m.ByteSize(recordVersion), 900, "as much as fits")
		require.True(t, bytes.HasPrefix(value, encoded(m.Value)))
		require.Equal(t, "k", string(encoded(m.Key)))
		require.Equal(t, strconv.Itoa(len(value)), get(m, RejectHeaderOriginalValueBytes))
		require.Equal(t, sha(value), get(m, RejectHeaderOriginalValueSHA256))
		require.Len(t, orig.Headers, 1, "the original is left alone")

		// Refused again: half the size, down to nothing to cut.
		for p.shrink(m) {
			next := p.message()
			require.Less(t, next.ByteSize(recordVersion), m.ByteSize(recordVersion))
			m = next
		}
		require.Zero(t, m.Value.Length())
		require.Equal(t, "k", string(encoded(m.Key)), "a key smaller than the headers that would replace it stays")
	})

	t.Run("KeyTooLarge", func(t *testing.T) {
		t.Parallel()
		key := bytes.Repeat([]byte("k"), 3000)
		orig := &sarama.ProducerMessage{Key: sarama.ByteEncoder(key), Value: sarama.ByteEncoder("value"), Headers: headers}
		m := (&pendingReject{orig: orig, budget: 1000}).message()
		require.LessOrEqual(t, m.ByteSize(recordVersion), 1000)
		require.Nil(t, m.Key)
		require.Equal(t, strconv.Itoa(len(key)), get(m, RejectHeaderOriginalKeyBytes))
		require.Equal(t, sha(key), get(m, RejectHeaderOriginalKeySHA256))
		require.Equal(t, "value", string(encoded(m.Value)), "the value fits once the key is gone")
		require.Equal(t, "5", get(m, RejectHeaderOriginalValueBytes))
	})
}

// The headers that say what was cut stand among promptline's, so that a
// replay of the rejects topic still finds exactly the original's headers,
// even those named as promptline names its own.
func TestTruncatedRejectKeepsTheOriginalsHeadersApart(t *testing.T) {
	t.Parallel()
	for name, key := range map[string][]byte{"Value": []byte("k"), "ValueAndKey": bytes.Repeat([]byte("k"), 3000)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := &sarama.ConsumerMessage{Topic: "prompts", Key: key, Value: bytes.Repeat([]byte("x"), 5000),
				Headers: []*sarama.RecordHeader{{Key: []byte("reason"), Value: []byte("mine")}, {Key: []byte("trace"), Value: []byte("t1")}}}
			orig := RejectMessage("prompts.rejects", src, "too_large", "d")
			m := (&pendingReject{orig: orig, budget: 1000}).message()
			var hs []*sarama.RecordHeader
			for i := range m.Headers {
				hs = append(hs, &m.Headers[i])
			}
			require.True(t, Truncated(hs))
			require.Equal(t, name == "ValueAndKey", header(m, RejectHeaderOriginalKeySHA256) != "", "the key was cut too")
			rest := OriginalHeaders(hs)
			require.Len(t, rest, 2)
			require.Equal(t, "reason", string(rest[0].Key))
			require.Equal(t, "mine", string(rest[0].Value))
			require.Equal(t, "trace", string(rest[1].Key))
			require.False(t, Truncated(src.Headers))
		})
	}
}
