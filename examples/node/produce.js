// Publish promptline prompt envelopes with kafkajs.
//
//   npm install
//   printf '%s\n' '{"message_id":"m-1","session_id":"s-1","text":"hello"}' |
//     node produce.js --brokers 127.0.0.1:9092 --topic prompts
//
// One envelope JSON object per input line. Each is published as written,
// with Kafka key = session_id, through the Java-compatible partitioner
// (murmur2, Partitioners.DefaultPartitioner in kafkajs 2.x), so a session's
// prompts land on the partition that Java, librdkafka with
// partitioner=murmur2_random, and promptline's Go producer choose.
// Prints "topic/partition/offset message_id" per prompt.
'use strict';

const readline = require('node:readline');
const { Kafka, Partitioners, logLevel } = require('kafkajs');

function flag(name, def) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

async function main() {
  const brokers = flag('--brokers', '127.0.0.1:9092').split(',');
  const topic = flag('--topic', 'prompts');

  const messages = [];
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (line.trim() === '') continue;
    const env = JSON.parse(line);
    if (typeof env.message_id !== 'string' || typeof env.session_id !== 'string') {
      throw new Error(`line ${messages.length + 1}: message_id and session_id are required strings`);
    }
    // The value is the line as written: promptline hashes what it admits,
    // and an exact retry must send the same bytes' meaning again.
    messages.push({ key: env.session_id, value: line, env });
  }

  const kafka = new Kafka({ clientId: 'promptline-node-example', brokers, logLevel: logLevel.WARN });
  const producer = kafka.producer({
    createPartitioner: Partitioners.DefaultPartitioner, // murmur2, as the Java client
    idempotent: true, // no duplicates from producer retries; acks=all
    maxInFlightRequests: 1, // keeps each session's prompts in order across retries
  });
  await producer.connect();
  try {
    // One send per prompt, in input order: a session's prompts keep their order.
    for (const m of messages) {
      const [meta] = await producer.send({ topic, acks: -1, messages: [{ key: m.key, value: m.value }] });
      console.log(`${meta.topicName}/${meta.partition}/${meta.baseOffset} ${m.env.message_id}`);
    }
  } finally {
    await producer.disconnect();
  }
}

main().catch((err) => {
  console.error('produce.js:', err.message || err);
  process.exit(1);
});
