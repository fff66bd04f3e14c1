package kafkautil

import (
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
	// too, the key's. They stand among promptline's headers, before the
	// original's.
	RejectHeaderOriginalValueBytes  = "original_value_bytes"
	RejectHeaderOriginalValueSHA256 = "original_value_sha256"
	RejectHeaderOriginalKeyBytes    = "original_key_bytes"
	RejectHeaderOriginalKeySHA256   = "original_key_sha256"
)

// rejectHeaderNames are the names OriginalHeaders strips from the front of
// a reject. A header promptline adds to its rejects belongs here.
var rejectHeaderNames = []string{
	RejectHeaderReason, RejectHeaderDetail, RejectHeaderSourceTopic, RejectHeaderSourcePartition, RejectHeaderSourceOffset,
	RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256, RejectHeaderOriginalKeyBytes, RejectHeaderOriginalKeySHA256,
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
// message that was sent.
func Truncated(reject []*sarama.RecordHeader) bool {
	for _, h := range reject {
		if h != nil && (string(h.Key) == RejectHeaderOriginalValueSHA256 || string(h.Key) == RejectHeaderOriginalKeySHA256) {
			return true
		}
	}
	return false
}

// withRejectHeaders returns a copy of a reject's headers with extra placed
// at the end of promptline's own (before the original's), so that
// OriginalHeaders still finds exactly the original's.
func withRejectHeaders(hs []sarama.RecordHeader, extra ...sarama.RecordHeader) []sarama.RecordHeader {
	n := 0
	for n < len(hs) && slices.Contains(rejectHeaderNames, string(hs[n].Key)) {
		n++
	}
	out := make([]sarama.RecordHeader, 0, len(hs)+len(extra))
	out = append(out, hs[:n]...)
	out = append(out, extra...)
	return append(out, hs[n:]...)
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
// rejects-topic message carries: those after the leading run of
// promptline's reject headers. A reject written before promptline kept the
// original's headers yields none.
func OriginalHeaders(reject []*sarama.RecordHeader) []*sarama.RecordHeader {
	i := 0
	for i < len(reject) && reject[i] != nil && slices.Contains(rejectHeaderNames, string(reject[i].Key)) {
		i++
	}
	return reject[i:]
}
