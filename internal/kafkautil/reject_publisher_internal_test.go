package kafkautil

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
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

	// The original's headers too large for the budget go, their size and
	// hash kept; the key stays when that is enough, and the layout that
	// OriginalHeaders and Truncated read stays promptline's.
	bigHeaders := []*sarama.RecordHeader{{Key: []byte("trace"), Value: []byte("t")}, {Key: []byte("nil")},
		{Key: []byte("big"), Value: bytes.Repeat([]byte("h"), 3000)}}
	encodedBig := []byte{10, 't', 'r', 'a', 'c', 'e', 2, 't', 6, 'n', 'i', 'l', 1, 6, 'b', 'i', 'g', 0xf0, 0x2e}
	encodedBig = append(encodedBig, bytes.Repeat([]byte("h"), 3000)...)
	keysOf := func(m *sarama.ProducerMessage) []string {
		var ks []string
		for _, h := range m.Headers {
			ks = append(ks, string(h.Key))
		}
		return ks
	}
	ptrs := func(m *sarama.ProducerMessage) []*sarama.RecordHeader {
		var hs []*sarama.RecordHeader
		for i := range m.Headers {
			hs = append(hs, &m.Headers[i])
		}
		return hs
	}
	five := []string{"reason", "detail", "source_topic", "source_partition", "source_offset"}

	t.Run("HeadersCut", func(t *testing.T) {
		t.Parallel()
		src := &sarama.ConsumerMessage{Topic: "prompts", Key: []byte("k"), Value: []byte("value"), Headers: bigHeaders}
		m := (&pendingReject{orig: RejectMessage("prompts.rejects", src, "headers_too_large", "d"), budget: 1000}).message()
		require.LessOrEqual(t, m.ByteSize(recordVersion), 1000)
		require.Equal(t, append(slices.Clone(five), RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256,
			RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256), keysOf(m))
		require.Equal(t, encodedBig, EncodeHeaders(RejectHeaders(src, "", "")[5:]), "the documented encoding")
		require.Equal(t, strconv.Itoa(len(encodedBig)), get(m, RejectHeaderOriginalHeadersBytes))
		require.Equal(t, sha(encodedBig), get(m, RejectHeaderOriginalHeadersSHA256))
		require.Empty(t, OriginalHeaders(ptrs(m)), "none of the original's is kept")
		require.True(t, Truncated(ptrs(m)))
		require.Equal(t, "k", string(encoded(m.Key)), "the key stays when cutting the headers is enough")
		require.Equal(t, "value", string(encoded(m.Value)))
	})

	t.Run("KeyAndHeadersCut", func(t *testing.T) {
		t.Parallel()
		src := &sarama.ConsumerMessage{Topic: "prompts", Key: bytes.Repeat([]byte("k"), 3000), Value: []byte("value"), Headers: bigHeaders}
		p := &pendingReject{orig: RejectMessage("prompts.rejects", src, "headers_too_large", "d"), budget: 1000}
		m := p.message()
		require.LessOrEqual(t, m.ByteSize(recordVersion), 1000)
		require.Nil(t, m.Key)
		require.Equal(t, append(slices.Clone(five), RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256,
			RejectHeaderOriginalKeyBytes, RejectHeaderOriginalKeySHA256, RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256),
			keysOf(m), "the pairs in their order")
		require.Empty(t, OriginalHeaders(ptrs(m)))
		require.True(t, Truncated(ptrs(m)))

		// A value-less original refused by a broker with a lower limit
		// still has its headers to cut.
		src.Value = nil
		src.Key = []byte("k")
		p = &pendingReject{orig: RejectMessage("prompts.rejects", src, "headers_too_large", "d"), budget: 100_000}
		m = p.message()
		require.Equal(t, keysOf(m)[5:], []string{"trace", "nil", "big"}, "whole: it fits the producer's limit")
		require.True(t, p.shrink(m), "the original's headers are left to cut")
		m = p.message()
		require.Empty(t, OriginalHeaders(ptrs(m)))
		require.False(t, p.shrink(m), "nothing is left to cut")
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
