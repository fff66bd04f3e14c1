package kafkautil

import (
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/IBM/sarama"
)

// The headers promptline writes on a rejects-topic message, in this order,
// before the original message's own headers (docs/session-events.md).
const (
	RejectHeaderReason          = "reason"
	RejectHeaderDetail          = "detail"
	RejectHeaderSourceTopic     = "source_topic"
	RejectHeaderSourcePartition = "source_partition"
	RejectHeaderSourceOffset    = "source_offset"

	// A reject published truncated (RejectPublisher) says what was cut:
	// the original value's size and SHA-256, and, when the key had to go
	// too, the key's; when the original's headers had to go, their size
	// and SHA-256 in the encoding of EncodeHeaders. They stand among
	// promptline's headers, before the original's.
	RejectHeaderOriginalValueBytes    = "original_value_bytes"
	RejectHeaderOriginalValueSHA256   = "original_value_sha256"
	RejectHeaderOriginalKeyBytes      = "original_key_bytes"
	RejectHeaderOriginalKeySHA256     = "original_key_sha256"
	RejectHeaderOriginalHeadersBytes  = "original_headers_bytes"
	RejectHeaderOriginalHeadersSHA256 = "original_headers_sha256"
)

// A reject's own headers have a fixed layout (RejectHeaders and
// withRejectHeaders write it): the five always, in this order, then the
// pairs that say what was cut, each whole or absent, in this order. It is
// read by position, not by name: the original's headers follow, and the
// original may carry one named as promptline names its own.
var (
	rejectHeaderNames = []string{
		RejectHeaderReason, RejectHeaderDetail, RejectHeaderSourceTopic, RejectHeaderSourcePartition, RejectHeaderSourceOffset,
	}
	rejectCutPairs = [][2]string{
		{RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256},
		{RejectHeaderOriginalKeyBytes, RejectHeaderOriginalKeySHA256},
		{RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256},
	}
	allRejectHeaderNames = append(slices.Clone(rejectHeaderNames),
		RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256, RejectHeaderOriginalKeyBytes, RejectHeaderOriginalKeySHA256,
		RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256)
)

// ownHeaders returns how many of the n headers that key names, from the
// first, are promptline's own: 0 when they do not begin with its five.
// cut reports that they include a pair that says what was cut.
func ownHeaders(n int, key func(i int) string) (own int, cut bool) {
	for i, name := range rejectHeaderNames {
		if i >= n || key(i) != name {
			return 0, false
		}
	}
	own = len(rejectHeaderNames)
	for _, pair := range rejectCutPairs {
		if own+1 < n && key(own) == pair[0] && key(own+1) == pair[1] {
			own += 2
			cut = true
		}
	}
	return own, cut
}

func keyOf(hs []*sarama.RecordHeader) func(int) string {
	return func(i int) string {
		if hs[i] == nil {
			return ""
		}
		return string(hs[i].Key)
	}
}

// RejectMessage is the rejects-topic copy of m: its key and bytes, with
// RejectHeaders.
func RejectMessage(topic string, m *sarama.ConsumerMessage, reason, detail string) *sarama.ProducerMessage {
	pm := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(m.Value), Headers: RejectHeaders(m, reason, detail)}
	if m.Key != nil {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	return pm
}

// Truncated reports whether a rejects-topic message was cut to fit: it
// holds only a prefix of the original (or lost its key), so it is not the
// message that was sent. It errs on the side of "cut", the safe side (a
// message judged cut is never admitted from the rejects topic): a header
// that says so anywhere in the leading run of headers named as
// promptline's counts, even when the layout is not promptline's exactly
// or the header is the original's.
func Truncated(reject []*sarama.RecordHeader) bool {
	// The run covers promptline's own headers, whose layout (ownHeaders)
	// puts the pairs that say "cut" among them.
	for _, h := range reject {
		if h == nil || !slices.ContainsFunc(allRejectHeaderNames, func(n string) bool { return n == string(h.Key) }) {
			return false
		}
		switch string(h.Key) {
		case RejectHeaderOriginalValueSHA256, RejectHeaderOriginalKeySHA256, RejectHeaderOriginalHeadersSHA256:
			return true
		}
	}
	return false
}

// splitRejectHeaders splits a reject about to be published, as
// RejectMessage made it, into promptline's own headers and the original's:
// its five, never a pair that says what was cut (only the message sent
// carries those). Read by name past the five, an original's first headers
// named as such a pair would be taken for promptline's, kept ahead of the
// pairs a cut adds, and left out of the original's size and hash.
func splitRejectHeaders(hs []sarama.RecordHeader) (own, original []sarama.RecordHeader) {
	n, _ := ownHeaders(len(hs), func(i int) string { return string(hs[i].Key) })
	n = min(n, len(rejectHeaderNames))
	return hs[:n], hs[n:]
}

// EncodeHeaders returns hs as a Kafka record (format v2) encodes them,
// after their count: for each header in order, the key's length as a
// zigzag varint and the key, then the value's length as a zigzag varint
// (-1 for a null value) and the value. original_headers_bytes and
// original_headers_sha256 are the size and SHA-256 of this encoding of
// the original's headers.
func EncodeHeaders(hs []sarama.RecordHeader) []byte {
	var b []byte
	for _, h := range hs {
		b = binary.AppendVarint(b, int64(len(h.Key)))
		b = append(b, h.Key...)
		if h.Value == nil {
			b = binary.AppendVarint(b, -1)
			continue
		}
		b = binary.AppendVarint(b, int64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

// RejectHeaders are the headers of the rejects-topic copy of m: the reason,
// the detail and m's topic, partition and offset, then m's own headers,
// unchanged and in their order. promptline's come first, so a reader that
// takes the first header of a name gets promptline's even when the
// original carried one of the same name.
func RejectHeaders(m *sarama.ConsumerMessage, reason, detail string) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(rejectHeaderNames)+len(m.Headers))
	out = append(out,
		sarama.RecordHeader{Key: []byte(RejectHeaderReason), Value: []byte(reason)},
		sarama.RecordHeader{Key: []byte(RejectHeaderDetail), Value: []byte(detail)},
		sarama.RecordHeader{Key: []byte(RejectHeaderSourceTopic), Value: []byte(m.Topic)},
		sarama.RecordHeader{Key: []byte(RejectHeaderSourcePartition), Value: []byte(strconv.Itoa(int(m.Partition)))},
		sarama.RecordHeader{Key: []byte(RejectHeaderSourceOffset), Value: []byte(strconv.FormatInt(m.Offset, 10))},
	)
	for _, h := range m.Headers {
		if h != nil {
			out = append(out, sarama.RecordHeader{Key: slices.Clone(h.Key), Value: slices.Clone(h.Value)})
		}
	}
	return out
}

// OriginalHeaders returns the headers of the original message that a
// rejects-topic message carries: those after promptline's own (ownHeaders).
// A reject written before promptline kept the original's headers yields
// none; a message that does not begin with promptline's five headers is
// not one of its rejects, and yields all of its headers.
func OriginalHeaders(reject []*sarama.RecordHeader) []*sarama.RecordHeader {
	n, _ := ownHeaders(len(reject), keyOf(reject))
	return reject[n:]
}
