package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// stage is one leg of a prompt's path, from database timestamps.
type stage struct {
	Name string  `json:"name"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
}

// stages splits the end-to-end latency of the measured prompts into legs,
// from the timestamps the pipeline stores: where the time goes. now() in
// Postgres is the start of the writing transaction, so each leg ends at
// the start of the transaction that closes it (the relay's published_at
// is the start of its pass, before it sends); the legs are approximations
// that add up to the path. A prompt admitted by the process that owns its
// session's wakes partition (every prompt here: one process) is woken
// locally, so its wake's trip through the relay and Kafka is off its path.
func stages(ctx context.Context, pool *pgxpool.Pool, ids []string, sentAt []time.Time) ([]stage, error) {
	var vals [8]*float64
	args := make([]any, len(vals))
	for i := range vals {
		args[i] = &vals[i]
	}
	if err := pool.QueryRow(ctx, stagesSQL, ids, sentAt).Scan(args...); err != nil {
		return nil, fmt.Errorf("reading stage timestamps: %w", err)
	}
	names := []string{
		"send → admission tx (Kafka, consumer batching)",
		"admission tx → promoted (commit, local wake, claim)",
		"promoted → answer stored (provider, commit)",
		"answer stored → event published (relay)",
	}
	out := make([]stage, len(names))
	for i, n := range names {
		out[i] = stage{Name: n, P50: deref(vals[2*i]), P99: deref(vals[2*i+1])}
	}
	return out, nil
}

func deref(f *float64) float64 {
	if f == nil {
		return 0
	}
	return *f
}

const stagesSQL = `
WITH s AS (
    SELECT * FROM unnest($1::text[], $2::timestamptz[]) AS s(id, sent_at)
), a AS (
    SELECT unnest(answers) AS id, completed_at FROM messages WHERE role = 'assistant'
), o AS (
    SELECT key, max(published_at) FILTER (WHERE topic = 'session-events') AS event_pub
    FROM outbox GROUP BY key
), j AS (
    SELECT extract(epoch FROM i.admitted_at - s.sent_at) * 1000 AS l1,
           extract(epoch FROM i.promoted_at - i.admitted_at) * 1000 AS l2,
           extract(epoch FROM a.completed_at - i.promoted_at) * 1000 AS l3,
           extract(epoch FROM o.event_pub - a.completed_at) * 1000 AS l4
    FROM s JOIN inputs i ON i.message_id = s.id
    JOIN a ON a.id = s.id
    JOIN o ON o.key = i.session_id
)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l1), percentile_cont(0.99) WITHIN GROUP (ORDER BY l1),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l2), percentile_cont(0.99) WITHIN GROUP (ORDER BY l2),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l3), percentile_cont(0.99) WITHIN GROUP (ORDER BY l3),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l4), percentile_cont(0.99) WITHIN GROUP (ORDER BY l4)
FROM j`
