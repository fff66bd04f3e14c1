package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Only deterministic data errors (SQLSTATE class 22 and 23) are data
// errors; what a retry may fix never is, wrapped or not.
func TestIsDataError(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"22021": true,  // character not in repertoire (U+0000)
		"22001": true,  // string data right truncation
		"22P02": true,  // invalid text representation
		"23505": true,  // unique violation
		"23514": true,  // check violation
		"23503": true,  // foreign key violation
		"40001": false, // serialization failure
		"40P01": false, // deadlock
		"55P03": false, // lock not available (lock_timeout)
		"57014": false, // query canceled (statement_timeout)
		"57P01": false, // admin shutdown (pg_terminate_backend, failover)
		"08006": false, // connection failure
		"42501": false, // insufficient privilege: an operator can grant it
		"53100": false, // disk full
		"":      false,
	} {
		err := fmt.Errorf("admitting 3 prompts: %w", &pgconn.PgError{Code: code, Message: "m"})
		require.Equal(t, want, isDataError(err), code)
	}
	require.False(t, isDataError(nil))
	require.False(t, isDataError(io.ErrUnexpectedEOF), "a lost connection")
	require.False(t, isDataError(context.DeadlineExceeded))
	require.False(t, isDataError(errors.New("22021")), "only a Postgres error says so")
}

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
		require.Equal(t, strconv.Itoa(len(value)), get(m, headerOriginalValueBytes))
		require.Equal(t, sha(value), get(m, headerOriginalValueSHA256))
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
		require.Equal(t, strconv.Itoa(len(key)), get(m, headerOriginalKeyBytes))
		require.Equal(t, sha(key), get(m, headerOriginalKeySHA256))
		require.Equal(t, "value", string(encoded(m.Value)), "the value fits once the key is gone")
		require.Equal(t, "5", get(m, headerOriginalValueBytes))
	})
}
