package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// promptText is the body of every generated prompt: about the size of a
// short chat message, and free of ScriptedProvider directives so that the
// provider answers at once with an echo.
const promptText = "Summarise the last three messages of this session in one sentence, please."

// sessionsPer is how many prompts share a session in the throughput runs
// (N/10 sessions): enough sessions that every partition has many, enough
// sharing that the sessions upsert sees conflicts as in production.
const sessionsPer = 10

// workload is a set of prompts and their encoded Kafka values.
type workload struct {
	prompts []envelope.Prompt
	values  [][]byte
}

// newWorkload builds n prompts over n/sessionsPer sessions with UUIDv7
// message IDs, as producers send them.
func newWorkload(n int) (*workload, error) { return newWorkloadPer(n, sessionsPer) }

// newWorkloadPer builds n prompts over n/per sessions.
func newWorkloadPer(n, per int) (*workload, error) { return newWorkloadText(n, per, promptText) }

// newWorkloadText builds n prompts over n/per sessions, each with text.
func newWorkloadText(n, per int, text string) (*workload, error) {
	run := uuid.Must(uuid.NewV7()).String()[:8]
	sessions := max(1, n/per)
	w := &workload{prompts: make([]envelope.Prompt, n), values: make([][]byte, n)}
	for i := range n {
		p := envelope.Prompt{
			MessageID: uuid.Must(uuid.NewV7()).String(),
			SessionID: "bench-" + run + "-" + strconv.Itoa(i%sessions),
			Text:      text,
		}
		v, err := envelope.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encoding prompt: %w", err)
		}
		w.prompts[i], w.values[i] = p, v
	}
	return w, nil
}

// byPartition splits the prompts as the murmur2 partitioner places them,
// keeping their order within a partition.
func (w *workload) byPartition(partitions int32) [][]envelope.Prompt {
	out := make([][]envelope.Prompt, partitions)
	for _, p := range w.prompts {
		i := kafkautil.Murmur2Partition([]byte(p.SessionID), partitions)
		out[i] = append(out[i], p)
	}
	return out
}

// prefill produces the workload to the prompts topic before any consumer
// starts, so that the admission run measures a backlog, not the producer.
func prefill(ctx context.Context, brokers []string, topic string, w *workload) error {
	producer, err := sarama.NewSyncProducer(brokers, kafkautil.NewConfig("bench-prefill"))
	if err != nil {
		return fmt.Errorf("connecting prefill producer: %w", err)
	}
	defer producer.Close()
	const chunk = 5000
	for start := 0; start < len(w.prompts); start += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(start+chunk, len(w.prompts))
		msgs := make([]*sarama.ProducerMessage, 0, end-start)
		for i := start; i < end; i++ {
			msgs = append(msgs, &sarama.ProducerMessage{
				Topic: topic,
				Key:   sarama.StringEncoder(w.prompts[i].SessionID),
				Value: sarama.ByteEncoder(w.values[i]),
			})
		}
		if err := producer.SendMessages(msgs); err != nil {
			return fmt.Errorf("prefilling %s: %w", topic, err)
		}
	}
	return nil
}

// producePaced sends w's prompts to topic at rate per second, by the
// clock from its start (a late tick sends what is due), and returns once
// every prompt is acknowledged.
func producePaced(ctx context.Context, brokers []string, topic string, w *workload, rate float64) error {
	producer, err := sarama.NewSyncProducer(brokers, kafkautil.NewConfig("bench-paced"))
	if err != nil {
		return fmt.Errorf("connecting paced producer: %w", err)
	}
	defer producer.Close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for sent := 0; sent < len(w.prompts); {
		due := min(len(w.prompts), int(time.Since(start).Seconds()*rate)+1)
		if due > sent {
			msgs := make([]*sarama.ProducerMessage, 0, due-sent)
			for i := sent; i < due; i++ {
				msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(w.prompts[i].SessionID), Value: sarama.ByteEncoder(w.values[i])})
			}
			if err := producer.SendMessages(msgs); err != nil {
				return fmt.Errorf("producing %s at %.0f/s: %w", topic, rate, err)
			}
			sent = due
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// startBroker starts an embedded broker on a free loopback port with
// promptline's topics.
func startBroker(partitions int32) (*kafkautil.Broker, error) {
	return kafkautil.StartBroker(kafkautil.BrokerConfig{
		Addr: "127.0.0.1:0", Partitions: partitions, Topics: kafkautil.Topics{}.WithDefaults().All(),
	})
}

// cpuSample is a point in CPU time: the machine's busy time (all cores,
// from /proc/stat) and this process's (pipeline, broker, producer).
// Differences over a run say whether the machine was saturated and who
// used it; Postgres is most of the rest.
type cpuSample struct {
	at      time.Time
	machine time.Duration // busy, all cores
	self    time.Duration
}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		var busy int64
		for i, x := range f[1:] {
			v, _ := strconv.ParseInt(x, 10, 64)
			if i != 3 && i != 4 { // idle, iowait
				busy += v
			}
		}
		s.machine = time.Duration(busy) * 10 * time.Millisecond // USER_HZ = 100
	}
	return s
}

// cpuUse is CPU use over an interval, in cores.
type cpuUse struct {
	Machine float64 `json:"machine_cores"`
	Bench   float64 `json:"bench_process_cores"`
	Other   float64 `json:"other_cores"` // mostly Postgres
}

func cpuBetween(a, b cpuSample) cpuUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	m := (b.machine - a.machine).Seconds() / wall
	s := (b.self - a.self).Seconds() / wall
	return cpuUse{Machine: m, Bench: s, Other: max(0, m-s)}
}
