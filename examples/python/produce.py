"""Publish promptline prompt envelopes with confluent-kafka (librdkafka).

    python3 -m venv .venv && .venv/bin/pip install -r requirements.txt
    printf '%s\\n' '{"message_id":"m-1","session_id":"s-1","text":"hello"}' |
      .venv/bin/python produce.py --brokers 127.0.0.1:9092 --topic prompts

One envelope JSON object per input line. Each is published as written, with
Kafka key = session_id (UTF-8), through librdkafka's murmur2_random
partitioner: the Java client's murmur2 for keyed records, the partition every
other promptline producer chooses (docs/producers.md). librdkafka's default,
consistent_random, hashes with CRC32 and puts sessions elsewhere;
--partitioner exists to show that, not to be changed. Prints
"topic/partition/offset message_id" per prompt.
"""

import argparse
import json
import sys

from confluent_kafka import Producer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="prompts")
    ap.add_argument("--partitioner", default="murmur2_random",
                    help="librdkafka partitioner; promptline needs murmur2_random")
    args = ap.parse_args()

    messages = []
    for n, line in enumerate(sys.stdin.buffer.read().decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        env = json.loads(line)
        if not isinstance(env.get("message_id"), str) or not isinstance(env.get("session_id"), str):
            raise SystemExit(f"produce.py: line {n}: message_id and session_id are required strings")
        # The value is the line as written: promptline hashes what it admits,
        # and an exact retry must send the same envelope again.
        messages.append((env["session_id"].encode("utf-8"), line.encode("utf-8"), env["message_id"]))

    producer = Producer({
        "bootstrap.servers": args.brokers,
        "client.id": "promptline-python-example",
        "partitioner": args.partitioner,  # murmur2_random: as Java and promptline
        "enable.idempotence": True,  # acks=all, no duplicates from retries, order kept per partition
    })
    failed = []

    def delivered(err, msg, message_id):
        if err is not None:
            failed.append(f"{message_id}: {err}")
            return
        print(f"{msg.topic()}/{msg.partition()}/{msg.offset()} {message_id}", flush=True)

    for key, value, message_id in messages:
        producer.produce(args.topic, key=key, value=value,
                         on_delivery=lambda err, msg, m=message_id: delivered(err, msg, m))
        producer.poll(0)
    left = producer.flush(30)
    if left or failed:
        print(f"produce.py: {len(failed)} failed, {left} not delivered: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
