package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

var sentLine = regexp.MustCompile(`^([^/]+)/(\d+)/(\d+) message_id=(\S+)\n$`)

// sent parses the line of a single send.
func sent(t *testing.T, stdout string) (topic string, partition int32, offset int64, messageID string) {
	t.Helper()
	m := sentLine.FindStringSubmatch(stdout)
	require.NotNil(t, m, "send printed %q", stdout)
	p, err := strconv.ParseInt(m[2], 10, 32)
	require.NoError(t, err)
	o, err := strconv.ParseInt(m[3], 10, 64)
	require.NoError(t, err)
	return m[1], int32(p), o, m[4]
}

func TestSend(t *testing.T) {
	t.Parallel()

	const partitions = 4
	type testBundle struct{ addr string }
	setup := func(t *testing.T) testBundle {
		t.Helper()
		return testBundle{addr: testkit.Broker(t, partitions).Addr()}
	}
	// record returns the record a send printed, read back by a Sarama consumer.
	record := func(t *testing.T, addr string, partition int32, offset int64) *sarama.ConsumerMessage {
		t.Helper()
		for _, m := range testkit.ReadAll(t, addr, "prompts") {
			if m.Partition == partition && m.Offset == offset {
				return m
			}
		}
		require.FailNow(t, fmt.Sprintf("no record at prompts/%d/%d", partition, offset))
		return nil
	}

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		for _, session := range []string{"s-1", "21", "session-with-a-longer-id"} {
			res := runCLI(t.Context(), "", "send", "--brokers", b.addr, "--session", session, "--text", "hello "+session)
			require.NoError(t, res.err, res.stderr)
			topic, partition, offset, id := sent(t, res.stdout)
			require.Equal(t, "prompts", topic)
			require.Equal(t, kafkautil.Murmur2Partition([]byte(session), partitions), partition, "session %s", session)
			require.Equal(t, uuid.Version(7), uuid.MustParse(id).Version(), "default message ID is a UUIDv7")

			m := record(t, b.addr, partition, offset)
			require.Equal(t, session, string(m.Key))
			p, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
			require.NoError(t, err)
			require.Equal(t, envelope.Prompt{MessageID: id, SessionID: session, Text: "hello " + session, Delivery: envelope.DeliveryQueue}, p)
			require.True(t, p.Resumes())
		}
	})

	t.Run("AllFlags", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		res := runCLI(t.Context(), "", "send", "--brokers", " "+b.addr+", ", "--topic", "wakes",
			"--session", "s-9", "--text", "stop: use tabs\nplease", "--message-id", "m-42",
			"--delivery", "steer", "--no-resume")
		require.NoError(t, res.err, res.stderr)
		topic, partition, offset, id := sent(t, res.stdout)
		require.Equal(t, "wakes", topic)
		require.Equal(t, "m-42", id)
		require.Equal(t, kafkautil.Murmur2Partition([]byte("s-9"), partitions), partition)

		var got *sarama.ConsumerMessage
		for _, m := range testkit.ReadAll(t, b.addr, "wakes") {
			if m.Partition == partition && m.Offset == offset {
				got = m
			}
		}
		require.NotNil(t, got)
		p, err := envelope.Decode(got.Key, got.Value, envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, "stop: use tabs\nplease", p.Text)
		require.Equal(t, envelope.DeliverySteer, p.Delivery)
		require.False(t, p.Resumes())
	})

	t.Run("PartitionerFNV1a", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		fnv := sarama.NewHashPartitioner("prompts")
		differ := 0
		for i := range 8 {
			session := fmt.Sprintf("session-%d", i)
			res := runCLI(t.Context(), "", "send", "--brokers", b.addr, "--partitioner", "fnv1a", "--session", session, "--text", "x")
			require.NoError(t, res.err, res.stderr)
			_, partition, _, _ := sent(t, res.stdout)
			want, err := fnv.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(session)}, partitions)
			require.NoError(t, err)
			require.Equal(t, want, partition, "session %s", session)
			if partition != kafkautil.Murmur2Partition([]byte(session), partitions) {
				differ++
			}
		}
		require.Positive(t, differ, "the flag must change the partitioner")
	})
}

// writeFile writes lines to prompts.jsonl in a fresh directory.
func writeFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prompts.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

func envelopeLine(t *testing.T, p envelope.Prompt) string {
	t.Helper()
	b, err := envelope.Marshal(p)
	require.NoError(t, err)
	return string(b)
}

func TestSendFile(t *testing.T) {
	t.Parallel()

	const partitions = 4
	setup := func(t *testing.T) string {
		t.Helper()
		return testkit.Broker(t, partitions).Addr()
	}

	t.Run("PublishesEveryLineInOrder", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		const n = 60
		var lines []string
		for i := range n {
			lines = append(lines, envelopeLine(t, envelope.Prompt{
				MessageID: fmt.Sprintf("f-%03d", i), SessionID: fmt.Sprintf("s-%d", i%5), Text: fmt.Sprintf("prompt %03d", i),
			}))
			if i == 10 {
				lines = append(lines, "   ") // blank lines are skipped
			}
		}
		path := writeFile(t, lines...)

		res := runCLI(t.Context(), "", "send", "--brokers", addr, "--file", path)
		require.NoError(t, res.err, res.stderr)
		require.Equal(t, fmt.Sprintf("sent %d prompts to prompts\n", n), res.stdout)

		recs := testkit.ReadAll(t, addr, "prompts")
		require.Len(t, recs, n)
		texts := map[string][]string{}
		for _, m := range recs {
			p, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
			require.NoError(t, err)
			require.Equal(t, kafkautil.Murmur2Partition(m.Key, partitions), m.Partition)
			texts[p.SessionID] = append(texts[p.SessionID], p.Text)
		}
		require.Len(t, texts, 5)
		for session, ts := range texts {
			require.IsIncreasing(t, ts, "session %s keeps file order", session)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		in := envelopeLine(t, envelope.Prompt{MessageID: "m-1", SessionID: "s-1", Text: "one"}) + "\r\n" +
			envelopeLine(t, envelope.Prompt{MessageID: "m-2", SessionID: "s-1", Text: "two", Delivery: envelope.DeliverySteer}) + "\r\n"
		res := runCLI(t.Context(), in, "send", "--brokers", addr, "-f", "-")
		require.NoError(t, res.err, res.stderr)
		require.Equal(t, "sent 2 prompts to prompts\n", res.stdout)
		require.Len(t, testkit.ReadAll(t, addr, "prompts"), 2)
	})

	t.Run("BadLineSendsNothing", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		good := func(i int) string {
			return envelopeLine(t, envelope.Prompt{MessageID: fmt.Sprintf("m-%d", i), SessionID: "s-1", Text: "ok"})
		}
		cases := []struct {
			name  string
			lines []string
			want  string
		}{
			{"MissingMessageID", []string{good(1), `{"session_id":"s-1","text":"no id"}`, good(3)},
				"prompts.jsonl:2: missing_field: message_id is required"},
			{"InvalidJSON", []string{good(1), good(2), good(3), `{"message_id":`},
				"prompts.jsonl:4: invalid_json"},
			{"UnknownField", []string{`{"message_id":"m-1","session_id":"s-1","text":"x","priority":1}`},
				"prompts.jsonl:1: unknown_field"},
			{"Conflict", []string{good(1), good(2), `{"message_id":"m-1","session_id":"s-1","text":"other"}`},
				`prompts.jsonl:3: conflict: message_id "m-1" is used on line 1 with another payload`},
			{"NULInText", []string{good(1), `{"message_id":"m-2","session_id":"s-1","text":"a\u0000b"}`},
				"prompts.jsonl:2: invalid_field: text must not contain U+0000"},
			{"Empty", []string{"", " "}, "prompts.jsonl: no prompts"},
			{"TooLong", []string{good(1), `{"message_id":"m-2","session_id":"s-1","text":"` + strings.Repeat("x", 1<<20) + `"}`},
				"prompts.jsonl:2: too_large"},
		}
		for _, tc := range cases {
			res := runCLI(t.Context(), "", "send", "--brokers", addr, "--file", writeFile(t, tc.lines...))
			require.ErrorContains(t, res.err, tc.want, tc.name)
			require.Empty(t, res.stdout, tc.name)
		}
		require.Empty(t, testkit.ReadAll(t, addr, "prompts"), "nothing is sent when a line is bad")
	})
}

// TestSharedEnvironment: the producer reads its settings from an
// environment that also holds the consumer's (one ConfigMap for both), and
// still refuses a typo. cliconfig.Programs, which tells the two apart, must
// list every producer flag.
func TestSharedEnvironment(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, cliconfig.Settings(newRootCommandEnv(strings.NewReader(""), io.Discard, io.Discard, func() []string { return nil })),
		cliconfig.Programs["producer"], "update cliconfig.Programs[\"producer\"] with the producer's flags")

	// Validation comes before any connection: the delivery read from the
	// environment is refused, which shows that the environment was read.
	consumer := []string{"PROMPTLINE_DATABASE_URL=postgres://db/promptline", "PROMPTLINE_DB_MAX_CONNS=8", "PROMPTLINE_DELIVERY=x"}
	res := runCLIEnv(t.Context(), consumer, "send", "--session", "s", "--text", "t")
	require.ErrorContains(t, res.err, `--delivery: want queue or steer, got "x"`)

	res = runCLIEnv(t.Context(), append(consumer, "PROMPTLINE_DATABSE_URL=postgres://db/promptline"), "send", "--session", "s", "--text", "t")
	require.ErrorContains(t, res.err, "environment variable PROMPTLINE_DATABSE_URL: unknown setting")
}

func TestFlagErrors(t *testing.T) {
	t.Parallel()

	// Validation comes before any connection: the default broker address
	// is never dialled here.
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"Delivery", []string{"send", "--session", "s", "--text", "t", "--delivery", "x"}, `--delivery: want queue or steer, got "x"`},
		{"Partitioner", []string{"send", "--session", "s", "--text", "t", "--partitioner", "crc32"}, `--partitioner: want murmur2 or fnv1a, got "crc32"`},
		{"Brokers", []string{"send", "--brokers", " , ", "--session", "s", "--text", "t"}, `--brokers: want host:port[,host:port...], got " , "`},
		{"FileAndSession", []string{"send", "--file", "p.jsonl", "--session", "s"}, "--session cannot be combined with --file"},
		{"FileAndDelivery", []string{"send", "--file", "p.jsonl", "--delivery", "steer"}, "--delivery cannot be combined with --file"},
		{"MissingSession", []string{"send", "--text", "t"}, "--session is required"},
		{"MissingText", []string{"send", "--session", "s"}, "--text is required"},
		{"EmptyText", []string{"send", "--session", "s", "--text", ""}, "--text: invalid_field: text must not be empty"},
		{"BadSession", []string{"send", "--session", "a b", "--text", "t"}, "--session: invalid_field: session_id has a non-printable"},
		{"LongMessageID", []string{"send", "--session", "s", "--text", "t", "--message-id", strings.Repeat("m", 129)}, "--message-id: invalid_field: message_id must be 1 to 128"},
		{"InvalidUTF8", []string{"send", "--session", "s", "--text", "\xff"}, "--text: not valid UTF-8"},
		{"MissingFile", []string{"send", "--file", filepath.Join(t.TempDir(), "none.jsonl")}, "--file: open"},
		{"UnknownFlag", []string{"send", "--bogus"}, "unknown flag: --bogus (see 'producer send --help')"},
		{"FlagWithoutValue", []string{"send", "--session", "s", "--text", "t", "--delivery"}, "flag needs an argument: --delivery"},
		{"Count", []string{"watch", "--count", "-1"}, "--count: want 0 or more, got -1"},
		{"Timeout", []string{"watch", "--timeout", "soon"}, `invalid argument "soon" for "--timeout" flag`},
		{"NegativeTimeout", []string{"watch", "--timeout", "-1s"}, "--timeout: want 0 or more, got -1s"},
		{"WatchArgs", []string{"watch", "extra"}, `unknown command "extra" for "producer watch"`},
		// A filter no session can match would watch for nothing, silently.
		{"WatchBadSession", []string{"watch", "--session", "a b"}, "--session: invalid_field: session_id has a non-printable or non-ASCII character at byte 1"},
		// A misspelt type would match nothing; with --count and no
		// --timeout the watch would wait for ever.
		{"WatchUnknownType", []string{"watch", "--type", "turn.complete", "--count", "1"}, `--type: unknown event type "turn.complete"; want one of input.admitted,`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runCLI(t.Context(), "", tc.args...)
			require.ErrorContains(t, res.err, tc.want)
			require.Empty(t, res.stdout)
		})
	}
}
