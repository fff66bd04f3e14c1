package testkit

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/kafkautil"
)

// Node control for the broker-failure tests: a node is addressed by its
// number n (1-based), which is also its node.id, so the broker IDs that
// Sarama's metadata names are node numbers.

// RestartNode starts node n again on its data directory (after KillNode)
// and waits until the metadata names every node again.
func (k *ApacheKafka) RestartNode(n int) error {
	if err := k.StartNode(n); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ApacheKafkaStartTimeout)
	defer cancel()
	return k.awaitMetadata(ctx)
}

// PauseNode sends node n SIGSTOP: the JVM holds its sockets open and
// answers nothing, like a node in a long GC pause or a partitioned host.
func (k *ApacheKafka) PauseNode(n int) error {
	k.mu.Lock()
	if k.paused == nil {
		k.paused = map[int]bool{}
	}
	k.paused[n] = true
	k.mu.Unlock()
	return k.signal(n, syscall.SIGSTOP)
}

// ResumeNode sends node n SIGCONT.
func (k *ApacheKafka) ResumeNode(n int) error {
	err := k.signal(n, syscall.SIGCONT)
	k.mu.Lock()
	delete(k.paused, n)
	k.mu.Unlock()
	return err
}

func (k *ApacheKafka) signal(n int, sig syscall.Signal) error {
	nd := k.nodes[n-1]
	if nd == nil {
		return fmt.Errorf("node %d of the Apache Kafka cluster is not running", n)
	}
	return nd.cmd.Process.Signal(sig)
}

// Leader returns the node that leads partition of topic, by fresh
// metadata from the nodes that answer.
func (k *ApacheKafka) Leader(topic string, partition int32) (int, error) {
	client, err := k.client()
	if err != nil {
		return 0, err
	}
	defer client.Close()
	if err := client.RefreshMetadata(topic); err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	b, err := client.Leader(topic, partition)
	if err != nil {
		return 0, fmt.Errorf("leader of %s/%d: %w", topic, partition, err)
	}
	return int(b.ID()), nil
}

// Coordinator returns the node that coordinates the consumer group.
func (k *ApacheKafka) Coordinator(group string) (int, error) {
	client, err := k.client()
	if err != nil {
		return 0, err
	}
	defer client.Close()
	if err := client.RefreshCoordinator(group); err != nil {
		return 0, fmt.Errorf("coordinator of %s: %w", group, err)
	}
	b, err := client.Coordinator(group)
	if err != nil {
		return 0, fmt.Errorf("coordinator of %s: %w", group, err)
	}
	return int(b.ID()), nil
}

func (k *ApacheKafka) client() (sarama.Client, error) {
	cfg := kafkautil.NewConfig("testkit-control")
	cfg.Metadata.Retry.Max = 1
	// A paused node answers nothing: the control client starts from the
	// others, and gives up soon on a request that reached the paused one
	// (the metadata names it until the cluster fences it), so that Leader
	// and Coordinator tell what the cluster says while a node is stopped.
	cfg.Net.ReadTimeout = 2 * time.Second
	var seeds []string
	k.mu.Lock()
	for i, a := range k.addrs {
		if !k.paused[i+1] {
			seeds = append(seeds, a)
		}
	}
	k.mu.Unlock()
	return sarama.NewClient(seeds, cfg)
}

// NodeRunning reports whether node n was started and has not exited (a
// node that died on its own shows here; one stopped by KillNode or Stop
// is not running either).
func (k *ApacheKafka) NodeRunning(n int) bool {
	nd := k.nodes[n-1]
	if nd == nil {
		return false
	}
	select {
	case <-nd.done:
		return false
	default:
		return true
	}
}
