package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// TestBinary builds the command and runs it as a process: main's exit code
// and error line, and a real send.
func TestBinary(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "building the command needs the go tool on PATH")
	bin := filepath.Join(t.TempDir(), "producer")
	build := exec.CommandContext(t.Context(), gobin, "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	run := func(args ...string) (stdout, stderr string, code int) {
		var o, e bytes.Buffer
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &exit)
			code = exit.ExitCode()
		}
		return o.String(), e.String(), code
	}

	t.Run("BadFlagExitsNonZero", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := run("send", "--session", "s-1", "--text", "hi", "--delivery", "x")
		require.Equal(t, 1, code)
		require.Empty(t, stdout)
		require.Equal(t, "producer: --delivery: want queue or steer, got \"x\"\n", stderr)
	})

	// A broker without a port is a bad flag value, named as such before
	// anything connects (as the consumer and consumer replay do), for
	// every command.
	for _, args := range [][]string{
		{"send", "--session", "s-1", "--text", "hi"},
		{"watch", "--timeout", "1s"},
		{"reply", "--session", "s-1", "--request", "r-1", "once"},
	} {
		t.Run("BrokerWithoutPort_"+args[0], func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := run(append(args, "--brokers", "127.0.0.1:1,nohostport")...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Equal(t, "producer: --brokers: \"nohostport\" is not host:port\n", stderr)
		})
	}

	t.Run("Send", func(t *testing.T) {
		t.Parallel()
		addr := testkit.Broker(t, 4).Addr()
		stdout, stderr, code := run("send", "--brokers", addr, "--session", "s-1", "--text", "hi")
		require.Equal(t, 0, code, stderr)
		_, partition, _, _ := sent(t, stdout)
		require.Equal(t, kafkautil.Murmur2Partition([]byte("s-1"), 4), partition)
	})
}
