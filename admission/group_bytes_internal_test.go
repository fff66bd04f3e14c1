package admission

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// Combined batches are bounded by their text as well as by their count:
// small batches of large prompts from many partitions were combined up to
// maxBatch prompts whatever their size.
func TestTakeBatchesBoundsTheirText(t *testing.T) {
	t.Parallel()
	req := func(prompts, size int) *admitRequest {
		r := &admitRequest{}
		for range prompts {
			r.batch = append(r.batch, Incoming{Prompt: envelope.Prompt{Text: strings.Repeat("x", size)}})
		}
		return r
	}
	mib := 1 << 20
	for _, tc := range []struct {
		name   string
		queued []*admitRequest
		want   int
	}{
		{"SmallPrompts", []*admitRequest{req(10, 100), req(10, 100), req(10, 100)}, 3},
		{"ByCount", []*admitRequest{req(300, 10), req(300, 10)}, 1},
		{"ByText", []*admitRequest{req(8, mib), req(8, mib), req(1, 1)}, 2},
		{"ByTextAtTheBound", []*admitRequest{req(8, mib), req(8, mib), req(1, mib)}, 2},
		{"OneBatchOverTheBound", []*admitRequest{req(20, mib), req(1, 1)}, 1},
		{"ManyPartitionsOfLargePrompts", func() []*admitRequest {
			var q []*admitRequest
			for range 40 {
				q = append(q, req(10, mib))
			}
			return q
		}(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, takeBatches(tc.queued, 500, MaxBatchBytesDefault))
		})
	}
}
