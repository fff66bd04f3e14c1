package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/outbox"
)

// rawResult is the raw ceiling: admission's rows written with nothing
// else in the way.
type rawResult struct {
	Prompts int     `json:"prompts"`
	Writers int     `json:"writers"`
	Batch   int     `json:"batch"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"prompts_per_second"`
	CPU     cpuUse  `json:"cpu"`
}

// measureRaw writes the rows admission writes for the workload (a sessions
// upsert, the inputs, one input.admitted event and one wake per session in
// the outbox) as plain batched unnest INSERTs: one writer per partition,
// as admission has one transaction in flight per partition, each writing
// its partition's prompts in batches of batch in one transaction each. No
// Kafka, no decoding, no duplicate detection (RETURNING, the lookup of
// prior rows).
func measureRaw(ctx context.Context, pool *pgxpool.Pool, parts [][]envelope.Prompt, batch int) (rawResult, error) {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	c0 := sampleCPU()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, prompts := range parts {
		wg.Go(func() {
			for start := 0; start < len(prompts) && ctx.Err() == nil; start += batch {
				if err := writeRaw(ctx, pool, prompts[start:min(start+batch, len(prompts))]); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return rawResult{}, err
	}
	c1 := sampleCPU()
	secs := c1.at.Sub(c0.at).Seconds()
	return rawResult{
		Prompts: total, Writers: len(parts), Batch: batch, Seconds: secs,
		Rate: float64(total) / secs, CPU: cpuBetween(c0, c1),
	}, nil
}

func writeRaw(ctx context.Context, pool *pgxpool.Pool, batch []envelope.Prompt) error {
	now := time.Now().UTC()
	n := len(batch)
	ids, sessions, texts, deliveries := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	hashes, wakes := make([][]byte, n), make([]bool, n)
	topics, partitions, offsets := make([]string, n), make([]int32, n), make([]int64, n)
	rows := make([]outbox.Row, 0, n+n/sessionsPer+1)
	for i, p := range batch {
		ids[i], sessions[i], texts[i], deliveries[i] = p.MessageID, p.SessionID, p.Text, string(envelope.DeliveryQueue)
		hashes[i], wakes[i] = p.Hash(), true
		topics[i], partitions[i], offsets[i] = "prompts", 0, int64(i)
		rows = append(rows, jsonRow("session-events", p.SessionID, envelope.Event{
			ID: "input.admitted:" + p.MessageID, Type: envelope.EventInputAdmitted,
			SessionID: p.SessionID, At: now, MessageID: p.MessageID,
		}))
	}
	uniq := slices.Clone(sessions)
	slices.Sort(uniq)
	uniq = slices.Compact(uniq)
	for _, s := range uniq {
		rows = append(rows, jsonRow("wakes", s, envelope.Wake{SessionID: s, Reason: "admitted", At: now}))
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, rawSessionsSQL, uniq); err != nil {
			return fmt.Errorf("raw: upserting sessions: %w", err)
		}
		if _, err := tx.Exec(ctx, rawInputsSQL, ids, sessions, texts, hashes, deliveries, wakes, topics, partitions, offsets); err != nil {
			return fmt.Errorf("raw: inserting inputs: %w", err)
		}
		return outbox.Insert(ctx, tx, rows...)
	})
}

func jsonRow(topic, key string, v any) outbox.Row {
	b, _ := json.Marshal(v) // events and wakes always marshal
	return outbox.Row{Topic: topic, Key: key, Payload: b}
}

const rawSessionsSQL = `
INSERT INTO sessions (session_id)
SELECT s FROM unnest($1::text[]) AS s ORDER BY s
ON CONFLICT (session_id) DO UPDATE SET last_admitted_at = now()`

const rawInputsSQL = `
INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending,
                    source_topic, source_partition, source_offset)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::bool[],
                     $7::text[], $8::int[], $9::bigint[])`
