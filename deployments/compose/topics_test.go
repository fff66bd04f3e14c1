package compose_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// topicRow is one row of docs/deploy.md's topic settings table.
type topicRow struct {
	partitions, replication, minISR, cleanup, retention, maxMessage string
}

// deployTopics parses the table of docs/deploy.md's "Kafka: topics"
// section, and the text of that section.
func deployTopics(t *testing.T) (map[string]topicRow, string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n## Kafka: topics\n")
	require.NotEqual(t, -1, start, "docs/deploy.md has a section \"Kafka: topics\"")
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end != -1 {
		section = section[:end+3]
	}
	rows := map[string]topicRow{}
	header := "| topic | partitions | replication factor | `min.insync.replicas` | `cleanup.policy` | `retention.ms` | `max.message.bytes` |"
	require.Contains(t, section, header, "the table's columns")
	for l := range strings.Lines(section[strings.Index(section, header)+len(header):]) {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		if strings.HasPrefix(l, "|---") {
			continue
		}
		var cells []string
		for c := range strings.SplitSeq(strings.Trim(l, "|"), "|") {
			cells = append(cells, strings.Trim(strings.TrimSpace(c), "`"))
		}
		require.Len(t, cells, 7, "row %q", l)
		require.NotContains(t, rows, cells[0], "topic %s listed twice", cells[0])
		rows[cells[0]] = topicRow{cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]}
	}
	require.NotEmpty(t, rows)
	return rows, section
}

// flagDefault reads a flag's default from `consumer --help`.
func flagDefault(t *testing.T, help, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+--` + regexp.QuoteMeta(name) + ` \S+\s.*\(default ([^)]+)\)$`).FindStringSubmatch(help)
	require.NotNil(t, m, "consumer --help lists --%s with its default", name)
	return strings.Trim(m[1], `"`)
}

// kafkaTopicsLoop parses a shell loop `for t in A B ...; do kafka-topics.sh
// ... --create ... done` into its topics and flags.
func kafkaTopicsLoop(t *testing.T, script string) (topics []string, flags map[string][]string) {
	t.Helper()
	m := regexp.MustCompile(`for t in ([^;]+); do`).FindStringSubmatch(script)
	require.NotNil(t, m, "a loop over the topics in %q", script)
	topics = strings.Fields(m[1])
	body := script[strings.Index(script, "kafka-topics.sh"):]
	body = body[:strings.Index(body, "done")]
	flags = map[string][]string{}
	f := strings.Fields(strings.ReplaceAll(body, "\\\n", " "))
	for i := 0; i < len(f)-1; i++ {
		if name, ok := strings.CutPrefix(f[i], "--"); ok && !strings.HasPrefix(f[i+1], "--") {
			flags[name] = append(flags[name], f[i+1])
			i++
		}
	}
	return topics, flags
}

// TestDeployTopicSettings: docs/deploy.md's topic settings are the ones
// the code creates topics with and the tests ran against Apache Kafka
// with (kafkautil.Topics and TopicConfig, the consumer's flag defaults,
// scripts/kafka.sh), and the shipped topic creations (the compose stack,
// the documented kafka-topics.sh loop) apply them.
func TestDeployTopicSettings(t *testing.T) {
	t.Parallel()
	rows, section := deployTopics(t)
	names := kafkautil.Topics{}.WithDefaults().All()
	listed := make([]string, 0, len(rows))
	for name := range rows {
		listed = append(listed, name)
	}
	require.ElementsMatch(t, names, listed, "every topic of kafkautil.Topics, and no other")

	prod := kafkautil.TopicConfig(3)
	one := kafkautil.TopicConfig(1)
	require.NotContains(t, one, "min.insync.replicas", "one replica: the broker's default (1)")
	for name, r := range rows {
		require.Equal(t, "3", r.replication, name)
		require.Equal(t, *prod["min.insync.replicas"], r.minISR, name)
		require.Equal(t, *prod["cleanup.policy"], r.cleanup, name)
		require.Equal(t, *one["cleanup.policy"], r.cleanup, name)
		// Not set by EnsureTopics nor scripts/kafka.sh: Kafka's defaults,
		// which the tests ran with.
		require.NotContains(t, prod, "retention.ms")
		require.Equal(t, "604800000", r.retention, "%s: Kafka's default log.retention.hours=168", name)
		require.NotContains(t, prod, "max.message.bytes")
		require.Equal(t, strconv.Itoa(kafkautil.KafkaDefaultMaxMessageBytes), r.maxMessage, name)
		require.Equal(t, rows["prompts"].partitions, r.partitions, "%s: one partition count for all (prompts = wakes)", name)
	}

	t.Run("FlagDefaults", func(t *testing.T) {
		out, err := exec.Command(dockerfileBuild(t), "--help").CombinedOutput()
		require.NoError(t, err, "%s", out)
		help := string(out)
		maxValue := flagDefault(t, help, "max-value-bytes")
		maxMessage := flagDefault(t, help, "max-message-bytes")
		require.Equal(t, strconv.Itoa(kafkautil.MaxMessageBytesDefault), maxMessage)
		require.Contains(t, section, "`--max-value-bytes`\n`"+maxValue+"`", "deploy.md states --max-value-bytes' default")
		require.Contains(t, section, "`--max-message-bytes` `"+maxMessage+"`", "deploy.md states --max-message-bytes' default")
		require.Equal(t, rows["prompts"].partitions, flagDefault(t, help, "partitions"))
		// Every message the producer accepts fits every topic: a topic
		// counts the batch header on top of Sarama's measure.
		mm, err := strconv.Atoi(maxMessage)
		require.NoError(t, err)
		for name, r := range rows {
			limit, err := strconv.Atoi(r.maxMessage)
			require.NoError(t, err)
			require.GreaterOrEqual(t, limit, mm+kafkautil.RecordBatchHeaderBytes, "%s: max.message.bytes ≥ --max-message-bytes + the batch header", name)
		}
	})

	t.Run("ScriptsKafkaThreeNodes", func(t *testing.T) {
		// The three-node cluster of the tests: replication = nodes,
		// min.insync.replicas 2, and no size or retention override.
		b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "kafka.sh"))
		require.NoError(t, err)
		script := string(b)
		m := regexp.MustCompile(`isr=\$\(\(n > 1 \? (\d+) : 1\)\)`).FindStringSubmatch(script)
		require.NotNil(t, m, "scripts/kafka.sh sets min.insync.replicas for more than one node")
		require.Equal(t, rows["prompts"].minISR, m[1])
		require.Contains(t, script, "\nmin.insync.replicas=$isr\n")
		require.Contains(t, script, "\ndefault.replication.factor=$rf\n")
		for _, key := range []string{"log.retention", "message.max.bytes", "log.cleanup.policy", "max.message.bytes"} {
			require.NotContains(t, script, "\n"+key, "the tests run with Kafka's default %s", key)
		}
		pom, err := os.ReadFile(filepath.Join(repoRoot, "kafka", "pom.xml"))
		require.NoError(t, err)
		v := regexp.MustCompile(`<kafka.version>([^<]+)</kafka.version>`).FindSubmatch(pom)
		require.NotNil(t, v)
		compose, err := os.ReadFile("docker-compose.yml")
		require.NoError(t, err)
		for _, img := range regexp.MustCompile(`image: apache/kafka:(\S+)`).FindAllSubmatch(compose, -1) {
			require.Equal(t, string(v[1]), string(img[1]), "the compose stack runs the Kafka the tests ran")
		}
	})

	t.Run("DocumentedLoop", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
		require.NoError(t, err)
		doc := string(b)
		i := strings.Index(doc, "for t in ")
		require.NotEqual(t, -1, i)
		topics, flags := kafkaTopicsLoop(t, doc[i:])
		require.ElementsMatch(t, names, topics)
		requireLoopSettings(t, rows, flags, 3)
	})

	t.Run("Compose", func(t *testing.T) {
		d := docs(t, "docker-compose.yml")
		script := strings.Join(strs(t, at(t, d[0], "services", "topics", "command")), "\n")
		topics, flags := kafkaTopicsLoop(t, script)
		require.ElementsMatch(t, names, topics)
		requireLoopSettings(t, rows, flags, 1)
	})
}

// requireLoopSettings checks a kafka-topics.sh loop's flags against the
// table, for a cluster whose topics get replication rf.
func requireLoopSettings(t *testing.T, rows map[string]topicRow, flags map[string][]string, rf int16) {
	t.Helper()
	r := rows["prompts"]
	require.Equal(t, []string{r.partitions}, flags["partitions"])
	require.Equal(t, []string{strconv.Itoa(int(rf))}, flags["replication-factor"])
	want := map[string]string{}
	for k, v := range kafkautil.TopicConfig(rf) {
		want[k] = *v
	}
	got := map[string]string{}
	for _, c := range flags["config"] {
		k, v, ok := strings.Cut(c, "=")
		require.True(t, ok, c)
		got[k] = v
	}
	require.Equal(t, want, got, "the loop's --config entries are kafkautil.TopicConfig(%d)", rf)
	if rf >= 3 {
		require.Equal(t, r.minISR, got["min.insync.replicas"])
	}
	require.Equal(t, r.cleanup, got["cleanup.policy"])
}
