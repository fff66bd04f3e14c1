package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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

// syncBuffer is a writer that a running command and the test share; the
// test waits on its writes, not on time.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor returns once the buffer contains s, failing after timeout.
func (b *syncBuffer) waitFor(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !strings.Contains(b.String(), s) {
		select {
		case <-b.changed:
		case <-deadline.C:
			require.FailNow(t, fmt.Sprintf("waiting for %q; have %q", s, b.String()))
		}
	}
}

// readAll returns every record of topic, partition by partition, up to the
// high watermarks at the time of the call.
func readAll(t *testing.T, addr, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	client, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("test-read"))
	require.NoError(t, err)
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	require.NoError(t, err)
	defer consumer.Close()
	partitions, err := client.Partitions(topic)
	require.NoError(t, err)
	var out []*sarama.ConsumerMessage
	for _, p := range partitions {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		if hwm == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		timeout := time.NewTimer(30 * time.Second)
		for next := int64(0); next < hwm; {
			select {
			case m := <-pc.Messages():
				out = append(out, m)
				next = m.Offset + 1
			case err := <-pc.Errors():
				require.NoError(t, err)
			case <-timeout.C:
				require.FailNow(t, fmt.Sprintf("reading %s/%d up to offset %d", topic, p, hwm))
			}
		}
		timeout.Stop()
		require.NoError(t, pc.Close())
	}
	return out
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
