package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// The examples and the end-to-end tests of this package talk to a real
// promptline: TestMain builds cmd/consumer, starts a throwaway PostgreSQL
// cluster and one consumer process on its embedded broker (the demo's
// defaults), with --tool-permission echo=ask so that a prompt
// "/tool echo {...}" asks for a permission. Tests that need no consumer
// start brokers of their own.

// env is the running promptline of this test binary.
var env struct {
	brokers string // the consumer's embedded broker
}

func TestMain(m *testing.M) {
	stop, err := startPromptline()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting promptline for the client tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(testkit.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// startPromptline starts the database and the consumer and returns what
// stops them.
func startPromptline() (_ func(), err error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "promptline-client-test-")
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "consumer")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../cmd/consumer").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ../cmd/consumer: %w\n%s", err, out)
	}

	cluster, err := pgdb.StartCluster(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
	}
	stops = append(stops, func() { _ = cluster.Stop() })

	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--embedded-kafka-addr", addr, "--database-url", cluster.URL("postgres"),
		"--metrics-addr", "127.0.0.1:0", "--partitions", "4", "--group", "client-test",
		"--tool-permission", "echo=ask")
	cmd.Env = append(os.Environ(), "PROMPTLINE_DATABASE_URL=", "DATABASE_URL=")
	dieWithTest(cmd)
	logs, err := os.Create(filepath.Join(dir, "consumer.log"))
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the consumer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	running := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 1<<20)
		signalled := false
		for sc.Scan() {
			fmt.Fprintln(logs, sc.Text())
			var line struct{ Msg string }
			if !signalled && json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "consumer running" {
				signalled = true
				close(running)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	stops = append(stops, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		<-copied
		logs.Close()
	})
	select {
	case <-running:
	case err := <-exited:
		exited <- err
		<-copied
		b, _ := os.ReadFile(logs.Name())
		return nil, fmt.Errorf("the consumer exited (%v) before running:\n%s", err, b)
	case <-ctx.Done():
		return nil, errors.New("the consumer did not start within 5 minutes")
	}
	env.brokers = addr
	return stop, nil
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// unique returns name with a suffix of its own, so that the tests and
// examples that share the consumer never share a session.
func unique(name string) string { return name + "-" + uuid.NewString() }
