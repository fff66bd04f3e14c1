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

// An original whose first headers are named as the pair that says the
// original's headers were cut is cut like any other: the pair the reject
// adds covers every header of the original (docs/session-events.md: "their
// size and SHA-256 ... of the original's headers"), and none of them is
// left in the reject ("none of them follows"), so that a reader can check
// the original it finds at the source offset against the hash.
//
// It catches: the reject's own headers told from the original's by name
// (splitRejectHeaders) when the reject is cut, so that an original's
// leading headers named original_headers_bytes and original_headers_sha256
// are taken for promptline's: they stay in the reject, ahead of the value's
// pair, and the size and hash the reject carries leave them out.
func TestCutHeadersHashCoversAnOriginalsHeadersNamedLikeTheCutPair(t *testing.T) {
	t.Parallel()
	original := []*sarama.RecordHeader{
		{Key: []byte(RejectHeaderOriginalHeadersBytes), Value: []byte("1")},
		{Key: []byte(RejectHeaderOriginalHeadersSHA256), Value: []byte("the producer's own")},
		{Key: []byte("big"), Value: bytes.Repeat([]byte("h"), 3000)},
	}
	var want []sarama.RecordHeader
	for _, h := range original {
		want = append(want, *h)
	}
	encodedAll := EncodeHeaders(want)
	sum := sha256.Sum256(encodedAll)

	src := &sarama.ConsumerMessage{Topic: "prompts", Key: []byte("k"), Value: []byte("value"), Headers: original}
	m := (&pendingReject{orig: RejectMessage("prompts.rejects", src, "headers_too_large", "d"), budget: 1000}).message()
	require.LessOrEqual(t, m.ByteSize(recordVersion), 1000)

	var keys []string
	for _, h := range m.Headers {
		keys = append(keys, string(h.Key))
	}
	require.Equal(t, []string{"reason", "detail", "source_topic", "source_partition", "source_offset",
		RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256,
		RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256}, keys,
		"promptline's layout: the five, then the pairs in their order; none of the original's follows")
	require.Equal(t, strconv.Itoa(len(encodedAll)), header(m, RejectHeaderOriginalHeadersBytes), "the size of every original header")
	require.Equal(t, hex.EncodeToString(sum[:]), header(m, RejectHeaderOriginalHeadersSHA256), "the hash of every original header")
}
