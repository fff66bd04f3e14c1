#!/usr/bin/env bash
# The demo: the consumer on embedded defaults (its own Kafka-protocol broker
# on 127.0.0.1:9092; Postgres from DATABASE_URL, the local server, or a
# throwaway cluster), a handful of prompts from the producer, each answer
# printed as it arrives. Exits 0 when every answer came.
set -euo pipefail
bin=${1:-bin}
log=$(mktemp -t promptline-demo.XXXXXX)

"$bin/consumer" >"$log" 2>&1 &
consumer=$!
stop() {
	kill -TERM "$consumer" 2>/dev/null || true
	wait "$consumer" 2>/dev/null || true
}
trap stop EXIT

echo "consumer starting (log: $log)"
for _ in $(seq 1 600); do
	grep -q '"consumer running"' "$log" && break
	if ! kill -0 "$consumer" 2>/dev/null; then
		echo "the consumer exited:"; cat "$log"; exit 1
	fi
	sleep 0.1
done
grep -q '"consumer running"' "$log" || { echo "the consumer did not start in 60s:"; cat "$log"; exit 1; }

session="demo-$(date +%s)-$$"
"$bin/producer" send --session "$session" --text "hello, promptline"
"$bin/producer" send --session "$session" --text $'/reply I was told what to say\nplease answer'
"$bin/producer" send --session "$session" --text $'/sleep 300ms\nslow thinking'
"$bin/producer" send --session "$session" --text "/fail the model is on fire"
"$bin/producer" send --session "$session" --text "and I still answer after a failure"
"$bin/producer" send --session "$session" --text '/tool echo {"text": "a tool result, recorded in the ledger"}'

echo "answers:"
"$bin/producer" watch --from-beginning --session "$session" \
	--type turn.completed --type turn.failed --count 6 --timeout 60s
