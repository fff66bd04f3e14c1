package pipeline

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// A batch of prompts ends at MaxBatch messages or at the one that brings
// their values to MaxBatchBytes, whichever comes first, and never waits
// for more than is at hand.
func TestFillBatchBoundsItsBytes(t *testing.T) {
	t.Parallel()
	msgs := func(n, size int) (*sarama.ConsumerMessage, chan *sarama.ConsumerMessage) {
		ch := make(chan *sarama.ConsumerMessage, n)
		for i := range n {
			ch <- &sarama.ConsumerMessage{Offset: int64(i + 1), Value: make([]byte, size)}
		}
		return &sarama.ConsumerMessage{Offset: 0, Value: make([]byte, size)}, ch
	}
	for _, tc := range []struct {
		name              string
		n, size           int
		maxBatch, maxByte int
		want              int
	}{
		{"AllAtHand", 9, 10, 500, 16 << 20, 10},
		{"ByCount", 600, 10, 500, 16 << 20, 500},
		{"ByBytes", 100, 1 << 20, 500, 16 << 20, 16},
		{"OneOverTheBound", 3, 17 << 20, 500, 16 << 20, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			first, ch := msgs(tc.n, tc.size)
			batch, bytes := fillBatch(first, ch, tc.maxBatch, tc.maxByte)
			require.Len(t, batch, tc.want)
			require.Equal(t, tc.want*tc.size, bytes, "the batch's values, as the gate is released by")
			for i, m := range batch {
				require.Equal(t, int64(i), m.Offset, "in order, none skipped")
			}
			require.Len(t, ch, tc.n+1-tc.want, "the rest left for the next batch")
		})
	}
}
