package replay

import (
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// probeInterval is how long a partition waits for a message before it
// looks whether the rest of its range can be delivered at all.
const probeInterval = 250 * time.Millisecond

// invisibleUpTo returns the first offset at or after from, and before to,
// that a read-committed consumer would be given: it skips transaction
// markers (control batches, which take an offset and are never delivered)
// and the records of aborted transactions. It returns to, or more, when
// nothing before to will ever be delivered; less when a record before to
// is visible, or not yet decided (an open transaction, past the last
// stable offset, is not in a read-committed fetch).
//
// Sarama's partition consumer skips the same records without saying where
// it is, so a range ending on a marker (every committed transaction ends
// on one) would wait for ever for its last offset; this looks with one
// fetch of its own.
func invisibleUpTo(client sarama.Client, topic string, partition int32, from, to int64) (int64, error) {
	broker, err := client.Leader(topic, partition)
	if err != nil {
		return from, fmt.Errorf("finding the leader: %w", err)
	}
	for from < to {
		req := &sarama.FetchRequest{Version: 4, MaxWaitTime: 10, MinBytes: 1, MaxBytes: 1 << 20, Isolation: sarama.ReadCommitted}
		req.AddBlock(topic, partition, from, 1<<20, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return from, fmt.Errorf("fetching from offset %d: %w", from, err)
		}
		block := resp.GetBlock(topic, partition)
		if block == nil {
			return from, fmt.Errorf("fetching from offset %d: no answer for the partition", from)
		}
		if block.Err != sarama.ErrNoError {
			return from, fmt.Errorf("fetching from offset %d: %w", from, block.Err)
		}
		if len(block.RecordsSet) == 0 {
			return from, nil // nothing decided past from yet
		}
		aborted := map[int64]bool{}
		pending := block.AbortedTransactions
		start := from
		for _, records := range block.RecordsSet {
			rb := records.RecordBatch
			if rb == nil || rb.PartialTrailingRecord {
				return from, nil // legacy or cut short: the consumer tells
			}
			for len(pending) > 0 && pending[0].FirstOffset <= rb.LastOffset() {
				aborted[pending[0].ProducerID] = true
				pending = pending[1:]
			}
			switch {
			case rb.LastOffset() < from:
				// Before from (a fetch starts at the batch holding it).
			case rb.Control:
				// A marker ends its producer's transaction, aborted or not.
				delete(aborted, rb.ProducerID)
				from = rb.LastOffset() + 1
			case rb.IsTransactional && aborted[rb.ProducerID]:
				from = rb.LastOffset() + 1
			default:
				return from, nil // a record the consumer delivers
			}
			if from >= to {
				return from, nil
			}
		}
		if from == start {
			return from, nil
		}
	}
	return from, nil
}
