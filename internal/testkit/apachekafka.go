package testkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/apachekafka"
	"github.com/promptline/promptline/internal/kafkautil"
)

// ApacheKafkaStartTimeout bounds resolving the jars (the first time only),
// formatting storage and starting every node until the metadata names them
// all. A JVM starts in a few seconds on an idle machine, in tens on a busy
// one.
const ApacheKafkaStartTimeout = 3 * time.Minute

// ApacheKafka is an Apache Kafka cluster started for one test by
// StartApacheKafka: every node a combined broker+controller of one KRaft
// quorum, each its own JVM on loopback ports, from the jars that
// scripts/kafka.sh resolves (kafka/pom.xml pins the version).
type ApacheKafka struct {
	dir   string
	addrs []string
	nodes []*node

	mu     sync.Mutex
	paused map[int]bool // by PauseNode, until ResumeNode
}

// node is a running JVM; done closes when it has exited.
type node struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartApacheKafka starts an Apache Kafka cluster of nodes (1 or 3) for
// this test, with its data and logs in the test's temporary directory, and
// stops it in Cleanup. The first call on a machine resolves the jars with
// Maven (network); later ones run offline.
func StartApacheKafka(tb testing.TB, nodes int) *ApacheKafka {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ApacheKafkaStartTimeout)
	defer cancel()
	// The directory first: Cleanups run last-in first-out, so it is removed
	// after the nodes have stopped writing to it (the other way round, the
	// removal raced the running JVMs: "directory not empty", and the logs
	// were gone before a failed test could print them).
	base := tb.TempDir()
	k := &ApacheKafka{}
	tb.Cleanup(func() {
		k.Stop()
		if tb.Failed() {
			for i := range k.nodes {
				tb.Logf("Apache Kafka node %d, last lines of its log:\n%s", i+1, tail(filepath.Join(k.NodeDir(i+1), "logs", "server.log"), 40))
			}
		}
	})
	// The ports are free when chosen and bound by the JVM seconds later:
	// on a busy machine another process (a throwaway Postgres, another
	// test's listener) can take one in between. Such a start is tried
	// again on new ports, in a new directory; any other failure is the
	// test's.
	for try := 1; ; try++ {
		err := k.start(ctx, tb, filepath.Join(base, "try-"+strconv.Itoa(try)), nodes)
		if err == nil {
			return k
		}
		if try < 3 && ctx.Err() == nil && (k.portTaken() || k.diedSilently()) {
			tb.Logf("Apache Kafka: a port was taken before the node bound it, or a node died before its first line; starting again on new ports (%v)", err)
			k.Stop()
			continue
		}
		tb.Fatalf("Apache Kafka (logs in %s): %v", k.dir, err)
	}
}

// start prepares a cluster of nodes in a new directory on new ports and
// starts it.
func (k *ApacheKafka) start(ctx context.Context, tb testing.TB, dir string, nodes int) error {
	script, err := apachekafka.Script()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	k.dir, k.addrs, k.nodes = dir, nil, nil
	args := []string{"prepare", k.dir}
	ports := freePorts(tb, 2*nodes)
	for i := range nodes {
		broker, controller := ports[2*i], ports[2*i+1]
		args = append(args, broker+":"+controller)
		k.addrs = append(k.addrs, "127.0.0.1:"+broker)
	}
	if out, err := exec.CommandContext(ctx, script, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("preparing Apache Kafka: %v\n%s", err, out)
	}
	for i := range nodes {
		k.nodes = append(k.nodes, nil)
		if err := k.StartNode(i + 1); err != nil {
			return err
		}
	}
	return k.awaitMetadata(ctx)
}

// portTaken says whether a node's log says it could not bind its port.
func (k *ApacheKafka) portTaken() bool {
	for i := range k.nodes {
		if apachekafka.PortTaken(k.NodeDir(i + 1)) {
			return true
		}
	}
	return false
}

// diedSilently says whether a node exited before it wrote a line to
// either log: the JVM died before Kafka ran (one did so, once, on a
// loaded machine, its state lost), which is nothing the test did.
func (k *ApacheKafka) diedSilently() bool {
	for i, nd := range k.nodes {
		if nd == nil {
			continue
		}
		select {
		case <-nd.done:
		default:
			continue
		}
		empty := true
		for _, f := range []string{"server.log", "stdout.log"} {
			if st, err := os.Stat(filepath.Join(k.NodeDir(i+1), "logs", f)); err == nil && st.Size() > 0 {
				empty = false
			}
		}
		if empty {
			return true
		}
	}
	return false
}

// Addr is the first node's bootstrap address.
func (k *ApacheKafka) Addr() string { return k.addrs[0] }

// Addrs lists every node's bootstrap address.
func (k *ApacheKafka) Addrs() []string { return k.addrs }

// NodeDir is node n's directory (1-based): server.properties, data/, logs/.
func (k *ApacheKafka) NodeDir(n int) string {
	return filepath.Join(k.dir, "node-"+strconv.Itoa(n))
}

// StartNode starts node n (1-based), which must not be running; its
// stdout goes to logs/stdout.log, its log to logs/server.log.
func (k *ApacheKafka) StartNode(n int) error {
	script, err := apachekafka.Script()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(k.NodeDir(n), "logs", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	// The script execs the JVM: the process started here is the node.
	cmd := exec.Command(script, "node", k.dir, strconv.Itoa(n))
	cmd.Stdout, cmd.Stderr = out, out
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting Apache Kafka node %d: %w", n, err)
	}
	nd := &node{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(nd.done) }()
	k.nodes[n-1] = nd
	return nil
}

// KillNode sends node n SIGKILL and waits for it to exit.
func (k *ApacheKafka) KillNode(n int) { k.stopNode(n, syscall.SIGKILL, 0) }

// Stop stops every node, the last first: SIGTERM (a controlled
// shutdown), then SIGKILL after 10 seconds. Stopped all at once, the nodes
// of a quorum wait for each other's controllers and never exit; one after
// another, only the last node (a quorum of one of three) needs SIGKILL. It
// may be called twice.
func (k *ApacheKafka) Stop() {
	for i := len(k.nodes); i > 0; i-- {
		k.stopNode(i, syscall.SIGTERM, 10*time.Second)
	}
}

func (k *ApacheKafka) stopNode(n int, sig syscall.Signal, grace time.Duration) {
	nd := k.nodes[n-1]
	if nd == nil {
		return
	}
	k.nodes[n-1] = nil
	_ = nd.cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-nd.done:
			return
		case <-time.After(grace):
			_ = nd.cmd.Process.Kill()
		}
	}
	<-nd.done
}

// awaitMetadata waits until the metadata names every node as a broker.
func (k *ApacheKafka) awaitMetadata(ctx context.Context) error {
	cfg := kafkautil.NewConfig("testkit-await")
	cfg.Net.DialTimeout = time.Second
	cfg.Metadata.Retry.Max = 0
	var last error
	for {
		for i, nd := range k.nodes {
			if nd == nil {
				continue
			}
			select {
			case <-nd.done:
				return fmt.Errorf("node %d exited (%s): %s", i+1, nd.cmd.ProcessState, tail(filepath.Join(k.NodeDir(i+1), "logs", "stdout.log"), 20))
			default:
			}
		}
		client, err := sarama.NewClient(k.addrs, cfg)
		if err == nil {
			n := len(client.Brokers())
			client.Close()
			if n == len(k.addrs) {
				return nil
			}
			err = fmt.Errorf("metadata names %d of %d brokers", n, len(k.addrs))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not serving metadata: %w", errors.Join(ctx.Err(), last))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct loopback ports that were free a moment
// ago. The listeners are held until all are chosen: closed one by one, the
// kernel may hand the same port out twice (it did: a node's broker and
// controller listeners on one port, which Kafka refuses).
func freePorts(tb testing.TB, n int) []string {
	ports := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must(tb, err)
		defer ln.Close()
		ports = append(ports, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	return ports
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}
