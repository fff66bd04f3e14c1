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
)

// rejectHeaderNames are the names OriginalHeaders strips from the front of
// a reject. A header promptline adds to its rejects belongs here.
var rejectHeaderNames = []string{
	RejectHeaderReason, RejectHeaderDetail, RejectHeaderSourceTopic, RejectHeaderSourcePartition, RejectHeaderSourceOffset,
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
