package examples_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// nodeExample finds node and the kafkajs install of examples/node; both
// are part of the tested contract, so their absence fails the test.
func nodeExample(t *testing.T) (node, dir string) {
	t.Helper()
	testkit.SkipInShortTier(t, "Node.js and the kafkajs example")
	node, err := exec.LookPath("node")
	require.NoError(t, err, "the kafkajs example needs Node.js (node) on PATH")
	dir, err = filepath.Abs("node")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "kafkajs", "package.json"))
	require.NoError(t, err, "the kafkajs example needs its package: run `npm install` in examples/node")
	return node, dir
}

// run runs cmd with stdin and returns its standard output.
func run(t *testing.T, cmd *exec.Cmd, stdin string) string {
	t.Helper()
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s: %s", cmd, stderr.String())
	return string(out)
}

// printedPartitions parses "topic/partition/offset message_id" lines, the
// output of the examples in Node.js, Java and Python.
func printedPartitions(t *testing.T, out string) map[string]int32 {
	t.Helper()
	printed := map[string]int32{}
	for l := range strings.Lines(out) {
		pos, id, ok := strings.Cut(strings.TrimSpace(l), " ")
		require.True(t, ok, "printed %q", l)
		f := strings.Split(pos, "/")
		require.Len(t, f, 3, "topic/partition/offset: %q", pos)
		p, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		printed[id] = int32(p)
	}
	return printed
}

// TestProducersAgreeOnPartitions publishes one prompt per session from
// every client, each configured as docs/producers.md says: the Java client
// (kafka-clients 4.4.0, default partitioner, examples/java: the reference),
// confluent-kafka for Python (partitioner=murmur2_random,
// examples/python), kcat (librdkafka, partitioner=murmur2_random), kafkajs
// (Partitioners.DefaultPartitioner, examples/node) and Sarama with
// promptline's murmur2 partitioner (the Go producer). Every session must
// land on the partition the Java client chose, which is also the one
// kafkautil.Murmur2Partition computes; and librdkafka's default
// partitioner (consistent_random), run through the Python example, must
// disagree for some session, or the comparison would prove nothing.
//
// Session IDs are printable ASCII (envelope.Decode), but the hash runs on
// key bytes, and a client that encodes or hashes bytes above 0x7f
// differently (signed bytes in murmur2's tail, a key serialised in another
// charset) splits sessions without any ASCII key showing it. So some keys
// are UTF-8 of 2, 3 and 4 bytes a character, ending in each tail length;
// their envelopes are rejected as invalid_field, which is checked too.
func TestProducersAgreeOnPartitions(t *testing.T) {
	testkit.SkipInShortTier(t, "kcat, Node.js, Java 17 with Maven and Python 3")
	t.Parallel()
	node, dir := nodeExample(t)
	kcat, err := exec.LookPath("kcat")
	require.NoError(t, err, "the interop test needs kcat (librdkafka): apt-get install kcat")

	const partitions = 12
	addr := testkit.Broker(t, partitions).Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sessions := []string{
		"s-1", "s-2", "abc", "foobar", "session-with-a-longer-id", "0196a7c2-7b1e-7d4a-9c1e-1f2e3d4c5b6a", "x",
		// "21" hashes to a negative Java int: masking the sign bit and
		// taking the absolute value disagree on it.
		"21",
		// Non-ASCII: murmur2's tail (length % 4 = 1, 2, 3) holds bytes above 0x7f.
		"é", "€", "aé", "ab€", "séance-1", "会话-42", "🦀", "naïve-Ωmega-🦀x", "ключ",
	}
	clients := []string{"java", "python", "kcat", "kafkajs", "go"}
	id := func(client string, i int) string { return fmt.Sprintf("%s-%d", client, i) }
	lines := func(client string) string {
		var b strings.Builder
		for i, s := range sessions {
			v, err := envelope.Marshal(envelope.Prompt{MessageID: id(client, i), SessionID: s, Text: "from " + client + " to " + s})
			require.NoError(t, err)
			b.Write(v)
			b.WriteByte('\n')
		}
		return b.String()
	}
	printed := map[string]map[string]int32{} // client → message ID → partition, as the example printed it

	// Java, the reference: one JVM for every prompt.
	printed["java"] = printedPartitions(t, run(t, testkit.JavaProducer(ctx, t, "--brokers", addr, "--topic", "prompts"), lines("java")))

	// Python, as in docs/producers.md; and again with librdkafka's default.
	printed["python"] = printedPartitions(t, run(t, testkit.PythonProducer(ctx, t, "--brokers", addr, "--topic", "prompts"), lines("python")))
	printed["crc"] = printedPartitions(t, run(t, testkit.PythonProducer(ctx, t, "--brokers", addr, "--topic", "prompts", "--partitioner", "consistent_random"), lines("crc")))

	// kcat, as in docs/producers.md.
	var in strings.Builder
	for l := range strings.Lines(lines("kcat")) {
		var p struct {
			SessionID string `json:"session_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &p))
		in.WriteString(p.SessionID + ":" + l)
	}
	run(t, exec.CommandContext(ctx, kcat, "-P", "-b", addr, "-t", "prompts", "-K", ":", "-X", "partitioner=murmur2_random"), in.String())

	// kafkajs, as in docs/producers.md.
	cmd := exec.CommandContext(ctx, node, "produce.js", "--brokers", addr, "--topic", "prompts")
	cmd.Dir = dir
	printed["kafkajs"] = printedPartitions(t, run(t, cmd, lines("kafkajs")))

	// The Go package (client.Producer, which cmd/producer uses). It
	// validates as admission does, so the sessions that are not ASCII go
	// through plain Sarama with the exported partitioner, which is what
	// the package itself uses.
	producer, err := client.NewProducer(&client.Config{Brokers: []string{addr}})
	require.NoError(t, err)
	plain := kafkautil.NewConfig("example-test")
	plain.Producer.Partitioner = client.NewMurmur2Partitioner
	saramaProducer, err := sarama.NewSyncProducer([]string{addr}, plain)
	require.NoError(t, err)
	for l := range strings.Lines(lines("go")) {
		p, err := envelope.Decode(nil, []byte(l), envelope.Limits{})
		if err == nil {
			part, _, err := producer.Send(ctx, p)
			require.NoError(t, err)
			printed["go"] = mapSet(printed["go"], p.MessageID, part)
			continue
		}
		var raw struct {
			MessageID string `json:"message_id"`
			SessionID string `json:"session_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &raw))
		part, _, err := saramaProducer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(raw.SessionID), Value: sarama.StringEncoder(strings.TrimSuffix(l, "\n"))})
		require.NoError(t, err)
		printed["go"] = mapSet(printed["go"], raw.MessageID, part)
	}
	require.NoError(t, producer.Close())
	require.NoError(t, saramaProducer.Close())

	// Read everything back with Sarama and compare.
	where := map[string]int32{} // message ID → partition, as read back
	for _, m := range testkit.ReadAll(t, addr, "prompts") {
		var env struct {
			MessageID string `json:"message_id"`
			SessionID string `json:"session_id"`
		}
		require.NoError(t, json.Unmarshal(m.Value, &env), "record %s", m.Value)
		require.Equal(t, env.SessionID, string(m.Key), "%s: the key is the session ID in UTF-8", env.MessageID)
		_, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
		if isASCII(env.SessionID) {
			require.NoError(t, err, "record %s decodes as admission decodes it", m.Value)
		} else {
			var reject *envelope.RejectError
			require.True(t, errors.As(err, &reject), "record %s: %v", m.Value, err)
			require.Equal(t, envelope.ReasonInvalidField, reject.Reason, "a non-ASCII session ID is an invalid field")
		}
		require.NotContains(t, where, env.MessageID)
		where[env.MessageID] = m.Partition
	}
	require.Len(t, where, (len(clients)+1)*len(sessions))

	spread := map[int32]bool{}
	crcDiffers := 0
	for i, s := range sessions {
		java := where[id("java", i)]
		spread[java] = true
		require.Equal(t, kafkautil.Murmur2Partition([]byte(s), partitions), java, "session %q: the Java client against promptline's murmur2", s)
		for _, client := range clients {
			require.Equal(t, java, where[id(client, i)], "session %q from %s, against the Java client", s, client)
			if p, ok := printed[client]; ok {
				require.Equal(t, java, p[id(client, i)], "session %q: partition printed by the %s example", s, client)
			}
		}
		require.Equal(t, where[id("crc", i)], printed["crc"][id("crc", i)])
		if where[id("crc", i)] != java {
			crcDiffers++
		}
	}
	require.Greater(t, len(spread), 1, "the sessions must exercise more than one partition")
	require.Positive(t, crcDiffers, "librdkafka's default partitioner (consistent_random) must disagree for some session, or the check has no teeth")
	t.Logf("%d sessions over %d partitions; consistent_random put %d of them elsewhere", len(sessions), len(spread), crcDiffers)
}

func mapSet(m map[string]int32, k string, v int32) map[string]int32 {
	if m == nil {
		m = map[string]int32{}
	}
	m[k] = v
	return m
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
