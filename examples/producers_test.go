package examples_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// nodeExample finds node and the kafkajs install of examples/node; both
// are part of the tested contract, so their absence fails the test.
func nodeExample(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	require.NoError(t, err, "the kafkajs example needs Node.js (node) on PATH")
	dir, err = filepath.Abs("node")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "kafkajs", "package.json"))
	require.NoError(t, err, "the kafkajs example needs its package: run `npm install` in examples/node")
	return node, dir
}

// TestProducersAgreeOnPartitions publishes one prompt per session from
// three clients, each configured as docs/producers.md says: kcat
// (librdkafka, partitioner=murmur2_random), kafkajs
// (Partitioners.DefaultPartitioner, examples/node/produce.js) and Sarama
// with promptline's murmur2 partitioner (the Go producer). Every session
// must land on one partition, the Java client's, and every record must
// decode as admission decodes it.
func TestProducersAgreeOnPartitions(t *testing.T) {
	t.Parallel()
	node, dir := nodeExample(t)
	kcat, err := exec.LookPath("kcat")
	require.NoError(t, err, "the interop test needs kcat (librdkafka): apt-get install kcat")

	const partitions = 8
	addr := testkit.Broker(t, partitions).Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	// "21" hashes to a negative Java int: masking the sign bit and taking
	// the absolute value disagree on it.
	sessions := []string{"s-1", "s-2", "21", "abc", "foobar", "session-with-a-longer-id", "0196a7c2-7b1e-7d4a-9c1e-1f2e3d4c5b6a", "x"}
	line := func(client, s string) string {
		v, err := envelope.Marshal(envelope.Prompt{MessageID: client + "-" + s, SessionID: s, Text: "from " + client})
		require.NoError(t, err)
		return string(v)
	}

	// kcat, as in docs/producers.md.
	var in strings.Builder
	for _, s := range sessions {
		in.WriteString(s + ":" + line("kcat", s) + "\n")
	}
	cmd := exec.CommandContext(ctx, kcat, "-P", "-b", addr, "-t", "prompts", "-K", ":", "-X", "partitioner=murmur2_random")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kcat -P: %s", out)

	// kafkajs, as in docs/producers.md.
	in.Reset()
	for _, s := range sessions {
		in.WriteString(line("kafkajs", s) + "\n")
	}
	cmd = exec.CommandContext(ctx, node, "produce.js", "--brokers", addr, "--topic", "prompts")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(in.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	require.NoError(t, err, "node produce.js: %s", stderr.String())
	printed := map[string]int32{}
	for l := range strings.Lines(string(out)) {
		pos, id, ok := strings.Cut(strings.TrimSpace(l), " ")
		require.True(t, ok, "produce.js printed %q", l)
		f := strings.Split(pos, "/")
		require.Len(t, f, 3, "topic/partition/offset: %q", pos)
		p, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		printed[strings.TrimPrefix(id, "kafkajs-")] = int32(p)
	}
	require.Len(t, printed, len(sessions))

	// The Go producer's configuration (cmd/producer: kafkautil.NewConfig,
	// murmur2).
	producer, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("example-test"))
	require.NoError(t, err)
	for _, s := range sessions {
		_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(s), Value: sarama.StringEncoder(line("go", s))})
		require.NoError(t, err)
	}
	require.NoError(t, producer.Close())

	// Read everything back and compare.
	where := map[string]map[string]int32{} // client → session → partition
	c, err := sarama.NewConsumer([]string{addr}, kafkautil.NewConfig("example-reader"))
	require.NoError(t, err)
	defer c.Close()
	client, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("example-offsets"))
	require.NoError(t, err)
	defer client.Close()
	for p := range int32(partitions) {
		hwm, err := client.GetOffset("prompts", p, sarama.OffsetNewest)
		require.NoError(t, err)
		if hwm == 0 {
			continue
		}
		pc, err := c.ConsumePartition("prompts", p, sarama.OffsetOldest)
		require.NoError(t, err)
		for m := range pc.Messages() {
			pr, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
			require.NoError(t, err, "record %s decodes as admission decodes it", m.Value)
			who, _, _ := strings.Cut(pr.MessageID, "-")
			if where[who] == nil {
				where[who] = map[string]int32{}
			}
			where[who][pr.SessionID] = m.Partition
			if m.Offset == hwm-1 {
				break
			}
		}
		require.NoError(t, pc.Close())
	}
	spread := map[int32]bool{}
	for _, s := range sessions {
		want := kafkautil.Murmur2Partition([]byte(s), partitions)
		spread[want] = true
		for _, who := range []string{"kcat", "kafkajs", "go"} {
			require.Equal(t, want, where[who][s], fmt.Sprintf("session %q from %s", s, who))
		}
		require.Equal(t, want, printed[s], "session %q: partition printed by produce.js", s)
	}
	require.Greater(t, len(spread), 1, "the sessions must exercise more than one partition")
}
