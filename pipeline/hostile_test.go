package pipeline_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// TestHostileInputs sends a corpus of hostile messages on one partition:
// each lands in prompts.rejects with its reason, in order, nothing of them
// is admitted, and a valid prompt after them still runs.
func TestHostileInputs(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sess := "hostile"
	key := []byte(sess)
	valid := func(extra string) string {
		return `{"message_id":"m","session_id":"hostile","text":"x"` + extra + `}`
	}
	corpus := []struct {
		name    string
		value   []byte
		key     []byte
		headers []sarama.RecordHeader
		reason  string
	}{
		{"Depth10001", []byte(valid(`,"resume":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001))), key, nil, envelope.ReasonTooDeep},
		{"InvalidUTF8", []byte("{\"message_id\":\"m\",\"session_id\":\"hostile\",\"text\":\"\xc3\x28\"}"), key, nil, envelope.ReasonInvalidUTF8},
		{"NULInText", []byte(`{"message_id":"m-nul","session_id":"hostile","text":"a\u0000b"}`), key, nil, envelope.ReasonInvalidField},
		{"DuplicateKeys", []byte(`{"message_id":"a","message_id":"b","session_id":"hostile","text":"x"}`), key, nil, envelope.ReasonInvalidJSON},
		{"HugeNumber", []byte(valid(`,"resume":1e999999`)), key, nil, envelope.ReasonInvalidField},
		{"BinaryBody", []byte{0x00, 0x01, 0xfe, 0xff, 0x80, 0x7f}, key, nil, envelope.ReasonInvalidUTF8},
		{"MismatchedIDs", []byte(`{"message_id":"m-x","session_id":"someone-else","text":"x"}`), key, nil, envelope.ReasonKeyMismatch},
		{"UnknownField", []byte(valid(`,"admin":true`)), key, nil, envelope.ReasonUnknownField},
		{"LongID", []byte(`{"message_id":"` + strings.Repeat("i", 129) + `","session_id":"hostile","text":"x"}`), key, nil, envelope.ReasonInvalidField},
		{"TooManyHeaders", []byte(valid("")), key, manyHeaders(33, 1), envelope.ReasonTooManyHeaders},
		{"HugeHeaders", []byte(valid("")), key, manyHeaders(2, 9000), envelope.ReasonHeadersTooLarge},
	}
	for _, c := range corpus {
		_, _, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.ByteEncoder(c.key),
			Value: sarama.ByteEncoder(c.value), Headers: c.headers})
		require.NoError(t, err, c.name)
	}
	b.send(t, envelope.Prompt{MessageID: "after", SessionID: sess, Text: "still here"})

	require.Equal(t, "echo: still here", b.waitTurn(t, "after").Text, "the partition moved on")
	require.Eventually(t, func() bool { return len(b.rejects.All()) == len(corpus) }, 20*time.Second, 10*time.Millisecond)
	for i, r := range b.rejects.All() {
		require.Equal(t, corpus[i].reason, testkit.Header(r, "reason"), "%s: %s", corpus[i].name, testkit.Header(r, "detail"))
		require.Equal(t, string(corpus[i].value), string(r.Value), "%s: the original bytes", corpus[i].name)
		require.LessOrEqual(t, len(testkit.Header(r, "detail")), 512, "%s: a bounded detail", corpus[i].name)
		require.Len(t, r.Headers, 5+len(corpus[i].headers), "%s: promptline's five headers, then the original's", corpus[i].name)
		for j, h := range corpus[i].headers {
			require.Equal(t, string(h.Key), string(r.Headers[5+j].Key), "%s: the original's headers, in order", corpus[i].name)
		}
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs`), "only the valid prompt was admitted")
}

func manyHeaders(n, size int) []sarama.RecordHeader {
	hs := make([]sarama.RecordHeader, n)
	for i := range hs {
		hs[i] = sarama.RecordHeader{Key: []byte{'h', byte('a' + i%26)}, Value: []byte(strings.Repeat("v", size))}
	}
	return hs
}

// TestReplyWithAHugeKeyIsRejectedWhole: a permission reply whose Kafka key
// is not its request's session is rejected with reason key_mismatch, and
// its detail names the key bounded, as a prompt's does: a key of 300 KB of
// control bytes, quoted whole into the detail (four bytes each), made a
// reject that could not be published even without the original's key and
// value, and it was dropped (reject_unpublished) instead of reaching the
// rejects topic (P6).
func TestReplyWithAHugeKeyIsRejectedWhole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{replies: true})
	sess := id(t, "s")
	_, err := b.pool.Exec(ctx, `ALTER TABLE permission_requests DROP CONSTRAINT permission_requests_call_id_fkey`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1)`, sess)
	require.NoError(t, err)
	for _, r := range []string{"r-key", "r-last"} {
		_, err = b.pool.Exec(ctx, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
			VALUES ($1, $2, $1, 'echo', 'echo', 'pending')`, r, sess)
		require.NoError(t, err)
	}

	key := bytes.Repeat([]byte{0x01}, 300_000)
	value := `{"request_id":"r-key","reply":"once"}`
	_, _, err = b.producer.SendMessage(&sarama.ProducerMessage{Topic: "permission-replies", Key: sarama.ByteEncoder(key),
		Value: sarama.StringEncoder(value)})
	require.NoError(t, err)
	_, _, err = b.producer.SendMessage(&sarama.ProducerMessage{Topic: "permission-replies", Key: sarama.StringEncoder(sess),
		Value: sarama.StringEncoder(`{"request_id":"r-last","reply":"once"}`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM permission_requests WHERE request_id = 'r-last' AND status = 'approved'`) == 1
	}, 20*time.Second, 10*time.Millisecond, "the reply behind it was applied")
	require.Eventually(t, func() bool { return len(b.rejects.All()) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the reply with a huge key reached the rejects topic")
	r := b.rejects.All()[0]
	require.Equal(t, envelope.ReasonKeyMismatch, testkit.Header(r, "reason"))
	require.LessOrEqual(t, len(testkit.Header(r, "detail")), 512, "a bounded detail")
	require.Equal(t, value, string(r.Value), "whole")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests WHERE request_id = 'r-key' AND status = 'pending'`))
}
