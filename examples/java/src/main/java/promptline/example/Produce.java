// Publish promptline prompt envelopes with the official Java client.
//
//   mvn -q package
//   printf '%s\n' '{"message_id":"m-1","session_id":"s-1","text":"hello"}' |
//     java -cp 'target/classes:target/lib/*' promptline.example.Produce --brokers 127.0.0.1:9092 --topic prompts
//
// One envelope JSON object per input line. Each is published as written,
// with Kafka key = session_id (UTF-8), through the client's default
// partitioner: for a keyed record that is murmur2, the partition every
// other promptline producer must choose too (docs/producers.md). Prints
// "topic/partition/offset message_id" per prompt.
//
// With --transactional-id ID the prompts are sent in one Kafka transaction,
// committed at the end of the input; with --abort as well, it is aborted
// instead, and promptline admits none of them (it reads committed data only).
package promptline.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public final class Produce {
  private Produce() {}

  private static String flag(String[] args, String name, String def) {
    for (int i = 0; i + 1 < args.length; i++) {
      if (args[i].equals(name)) {
        return args[i + 1];
      }
    }
    return def;
  }

  private static boolean has(String[] args, String name) {
    for (String a : args) {
      if (a.equals(name)) {
        return true;
      }
    }
    return false;
  }

  public static void main(String[] args) throws Exception {
    String brokers = flag(args, "--brokers", "127.0.0.1:9092");
    String topic = flag(args, "--topic", "prompts");
    String transactionalId = flag(args, "--transactional-id", null);
    boolean abort = has(args, "--abort");

    ObjectMapper json = new ObjectMapper();
    List<ProducerRecord<String, String>> records = new ArrayList<>();
    List<String> ids = new ArrayList<>();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line; (line = in.readLine()) != null; ) {
      if (line.isBlank()) {
        continue;
      }
      JsonNode env = json.readTree(line);
      JsonNode id = env.get("message_id");
      JsonNode session = env.get("session_id");
      if (id == null || !id.isTextual() || session == null || !session.isTextual()) {
        throw new IllegalArgumentException("line " + (records.size() + 1) + ": message_id and session_id are required strings");
      }
      // The value is the line as written: promptline hashes what it admits,
      // and an exact retry must send the same envelope again.
      records.add(new ProducerRecord<>(topic, session.asText(), line));
      ids.add(id.asText());
    }

    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    props.put(ProducerConfig.CLIENT_ID_CONFIG, "promptline-java-example");
    // No partitioner.class: the default partitioner hashes keyed records
    // with murmur2, which is what promptline expects.
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true"); // no duplicates from retries, order kept per partition
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName()); // UTF-8
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    if (transactionalId != null) {
      props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
    }

    try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
      if (transactionalId != null) {
        producer.initTransactions();
        producer.beginTransaction();
      }
      // One send at a time, in input order: a session's prompts keep their order.
      for (int i = 0; i < records.size(); i++) {
        RecordMetadata meta = producer.send(records.get(i)).get();
        System.out.println(meta.topic() + "/" + meta.partition() + "/" + meta.offset() + " " + ids.get(i));
      }
      if (transactionalId != null) {
        if (abort) {
          producer.abortTransaction();
          System.err.println("aborted the transaction of " + records.size() + " prompts");
        } else {
          producer.commitTransaction();
        }
      }
      System.out.flush();
    }
  }
}
