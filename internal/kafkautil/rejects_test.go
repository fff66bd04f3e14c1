package kafkautil_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

func ptrs(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	out := make([]*sarama.RecordHeader, len(hs))
	for i := range hs {
		out[i] = &hs[i]
	}
	return out
}

func keys(hs []*sarama.RecordHeader) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = string(h.Key)
	}
	return out
}

// The original's headers are its own, whatever their names: one named as
// promptline names its reject headers (docs/session-events.md: "the
// original may carry a reason of its own") is the original's, not taken
// for promptline's. Truncated errs on the safe side: an original header
// that says "cut" right after promptline's makes the reject count as cut
// (never admitted from the rejects topic; its source offset holds it).
func TestOriginalHeadersKeepOnesNamedLikePromptlines(t *testing.T) {
	t.Parallel()
	orig := &sarama.ConsumerMessage{Topic: "prompts", Partition: 2, Offset: 9, Headers: []*sarama.RecordHeader{
		{Key: []byte("reason"), Value: []byte("the producer's own")},
		{Key: []byte("original_value_sha256"), Value: []byte("also the producer's")},
		{Key: []byte("trace"), Value: []byte("t1")},
	}}
	rm := kafkautil.RejectMessage("prompts.rejects", orig, "invalid_json", "x")
	got := kafkautil.OriginalHeaders(ptrs(rm.Headers))
	require.Equal(t, []string{"reason", "original_value_sha256", "trace"}, keys(got))
	require.Equal(t, "the producer's own", string(got[0].Value))
	require.True(t, kafkautil.Truncated(ptrs(rm.Headers)), "on the safe side")
	rm = kafkautil.RejectMessage("prompts.rejects", &sarama.ConsumerMessage{Topic: "prompts", Headers: []*sarama.RecordHeader{
		{Key: []byte("trace"), Value: []byte("t1")}, {Key: []byte("original_value_sha256"), Value: []byte("the producer's")},
	}}, "invalid_json", "x")
	require.False(t, kafkautil.Truncated(ptrs(rm.Headers)), "an original header after another of the original's says nothing of the reject")
	require.Equal(t, []string{"trace", "original_value_sha256"}, keys(kafkautil.OriginalHeaders(ptrs(rm.Headers))))

	// The original's last header is named as the first of a pair that
	// says what was cut, and nothing follows it: its own header, read
	// within the message's bounds.
	rm = kafkautil.RejectMessage("prompts.rejects", &sarama.ConsumerMessage{Topic: "prompts", Headers: []*sarama.RecordHeader{
		{Key: []byte("original_value_bytes"), Value: []byte("7")},
	}}, "invalid_json", "x")
	require.Equal(t, []string{"original_value_bytes"}, keys(kafkautil.OriginalHeaders(ptrs(rm.Headers))))

	// A reject whose original's headers were cut says so, even with
	// nothing else cut: none of the original's headers follows.
	rm = kafkautil.RejectMessage("prompts.rejects", &sarama.ConsumerMessage{Topic: "prompts"}, "headers_too_large", "x")
	rm.Headers = append(rm.Headers, sarama.RecordHeader{Key: []byte("original_headers_bytes"), Value: []byte("9")},
		sarama.RecordHeader{Key: []byte("original_headers_sha256"), Value: []byte("00")})
	require.True(t, kafkautil.Truncated(ptrs(rm.Headers)))
	require.Empty(t, kafkautil.OriginalHeaders(ptrs(rm.Headers)))

	// A message that does not begin with promptline's five headers is
	// not one of its rejects: every header is the original's.
	foreign := []sarama.RecordHeader{{Key: []byte("reason"), Value: []byte("r")}, {Key: []byte("detail"), Value: []byte("d")}}
	require.Equal(t, []string{"reason", "detail"}, keys(kafkautil.OriginalHeaders(ptrs(foreign))))
}
