package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// result is what one in-process run of the CLI printed and returned.
type result struct {
	stdout, stderr string
	err            error
}

// runCLI runs the producer command tree in-process with args: the real
// cobra flag parsing, the real Kafka clients.
func runCLI(ctx context.Context, stdin string, args ...string) result {
	var stdout, stderr bytes.Buffer
	root := newRootCommand(strings.NewReader(stdin), &stdout, &stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return result{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

// produce publishes values with their keys to topic.
func produce(t *testing.T, addr, topic string, kvs ...[2]string) {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("test-produce"))
	require.NoError(t, err)
	defer p.Close()
	for _, kv := range kvs {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{
			Topic: topic, Key: sarama.StringEncoder(kv[0]), Value: sarama.StringEncoder(kv[1]),
		})
		require.NoError(t, err)
	}
}
