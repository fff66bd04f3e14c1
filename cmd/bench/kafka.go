package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/apachekafka"
	"github.com/promptline/promptline/internal/kafkautil"
)

// The values of --kafka.
const (
	kafkaEmbedded = "embedded"
	kafkaApache   = "apache"
	kafkaBoth     = "both"
)

// kafkaBackend gives a measurement a broker whose promptline topics are
// fresh (empty, with the partitions asked for).
type kafkaBackend interface {
	// name is "embedded" or "apache".
	name() string
	// fresh returns brokers with promptline's topics empty and of the
	// given partition count, and a function that releases them. A backend
	// serves one measurement at a time: the next fresh call may reuse the
	// topics of the previous one.
	fresh(partitions int32) (brokers []string, release func(), err error)
}

// embeddedKafka starts an embedded broker per measurement.
type embeddedKafka struct{}

func (embeddedKafka) name() string { return kafkaEmbedded }

func (embeddedKafka) fresh(partitions int32) ([]string, func(), error) {
	b, err := startBroker(partitions)
	if err != nil {
		return nil, nil, err
	}
	return []string{b.Addr()}, b.Close, nil
}

// freshBrokers is backend.fresh, with the embedded broker for a nil backend.
func freshBrokers(kb kafkaBackend, partitions int32) ([]string, func(), error) {
	if kb == nil {
		kb = embeddedKafka{}
	}
	return kb.fresh(partitions)
}

// apacheKafka is one single-node Apache Kafka (KRaft, broker+controller)
// started through scripts/kafka.sh, the way `make kafka` and the test kit
// start it; every fresh call deletes promptline's topics and creates them
// again.
type apacheKafka struct {
	dir  string
	addr string
	cmd  *exec.Cmd
	done chan struct{} // closed when the node process has exited
}

func (*apacheKafka) name() string { return kafkaApache }

// startApacheKafka prepares a node in a temporary directory (the jars are
// resolved once by the script, Maven on the first run) and starts it on
// free loopback ports; it returns once the node serves metadata.
// KAFKA_JVM_OPTS, when unset, is set empty: full JIT, as the script advises
// for benchmarks.
func startApacheKafka(progress func(string, ...any)) (*apacheKafka, error) {
	// The ports are free when chosen and bound by the JVM seconds later;
	// another process can take one in between: such a start is tried again
	// on new ports (as internal/testkit does for the tests).
	for try := 1; ; try++ {
		k, err := startApacheKafkaOnce(progress)
		if err == nil || try == 3 || !errors.Is(err, errPortTaken) {
			return k, err
		}
		progress("Apache Kafka: a port was taken before the node bound it; starting again on new ports")
	}
}

// errPortTaken marks a start whose port another process took first.
var errPortTaken = errors.New("a port was taken before the node bound it")

func startApacheKafkaOnce(progress func(string, ...any)) (_ *apacheKafka, err error) {
	script, err := apachekafka.Script()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "promptline-bench-kafka-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	bp, cp := ports[0], ports[1]
	env := os.Environ()
	if _, ok := os.LookupEnv("KAFKA_JVM_OPTS"); !ok {
		env = append(env, "KAFKA_JVM_OPTS=")
	}
	prep := exec.Command(script, "prepare", dir, fmt.Sprintf("%d:%d", bp, cp))
	prep.Env = env
	if out, err := prep.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("scripts/kafka.sh prepare: %w: %s", err, out)
	}
	k := &apacheKafka{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(bp)), done: make(chan struct{})}
	stdout, err := os.Create(filepath.Join(dir, "node-1", "logs", "stdout.log"))
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	k.cmd = exec.Command(script, "node", dir, "1")
	k.cmd.Env, k.cmd.Stdout, k.cmd.Stderr = env, stdout, stdout
	// The node dies with the bench, however the bench ends.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting Apache Kafka: %w", err)
	}
	go func() { _ = k.cmd.Wait(); close(k.done) }()
	progress("Apache Kafka: starting a node on %s (logs in %s)", k.addr, filepath.Join(dir, "node-1", "logs"))
	started := time.Now()
	if err := k.awaitMetadata(3 * time.Minute); err != nil {
		k.stop()
		if apachekafka.PortTaken(filepath.Join(dir, "node-1")) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, err
	}
	progress("Apache Kafka: serving metadata after %.1fs", time.Since(started).Seconds())
	return k, nil
}

func (k *apacheKafka) awaitMetadata(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cfg := kafkautil.NewConfig("bench-kafka-wait")
	cfg.Metadata.Retry.Max = 0
	for {
		select {
		case <-k.done:
			return fmt.Errorf("apache Kafka exited at start: %s", k.logTail())
		default:
		}
		c, err := sarama.NewClient([]string{k.addr}, cfg)
		if err == nil {
			n := len(c.Brokers())
			c.Close()
			if n == 1 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("apache Kafka did not serve metadata in %s: %s", timeout, k.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (k *apacheKafka) logTail() string {
	b, _ := os.ReadFile(filepath.Join(k.dir, "node-1", "logs", "server.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func (k *apacheKafka) fresh(partitions int32) ([]string, func(), error) {
	brokers := []string{k.addr}
	admin, err := sarama.NewClusterAdmin(brokers, kafkautil.NewConfig("bench-kafka-admin"))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to Apache Kafka: %w", err)
	}
	defer admin.Close()
	topics := kafkautil.Topics{}.WithDefaults()
	existing, err := admin.ListTopics()
	if err != nil {
		return nil, nil, fmt.Errorf("listing topics: %w", err)
	}
	for _, t := range topics.All() {
		if _, ok := existing[t]; ok {
			if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				return nil, nil, fmt.Errorf("deleting topic %s: %w", t, err)
			}
		}
	}
	// Deletion is recorded by the controller at once; wait until the
	// metadata no longer names the topics before creating them again.
	deadline := time.Now().Add(time.Minute)
	for {
		existing, err = admin.ListTopics()
		if err != nil {
			return nil, nil, fmt.Errorf("listing topics: %w", err)
		}
		left := 0
		for _, t := range topics.All() {
			if _, ok := existing[t]; ok {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, nil, errors.New("apache Kafka: promptline's topics still listed a minute after their deletion")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := kafkautil.EnsureTopics(admin, topics, partitions, 1, nil); err != nil {
		return nil, nil, err
	}
	return brokers, func() {}, nil
}

// stop stops the node (SIGTERM, SIGKILL after 10s) and removes its
// directory.
func (k *apacheKafka) stop() {
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	os.RemoveAll(k.dir)
}

// freePorts returns n distinct free loopback ports (all held at once
// while they are picked).
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// kafkaModes validates --kafka.
func kafkaModes(v string) ([]string, error) {
	switch strings.ToLower(v) {
	case kafkaEmbedded:
		return []string{kafkaEmbedded}, nil
	case kafkaApache:
		return []string{kafkaApache}, nil
	case kafkaBoth:
		return []string{kafkaEmbedded, kafkaApache}, nil
	}
	return nil, fmt.Errorf("--kafka must be embedded, apache or both, got %q", v)
}
