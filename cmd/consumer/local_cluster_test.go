package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// TestConsoleSeesWhatTheConsumerLeftInTheLocalCluster is `make demo`, then
// `bin/consumer console`, on a machine where nothing usable answers on the
// default address: the consumer, started without a database, keeps its
// data in the local cluster; once it has stopped (and stopped the server),
// the console, also without a database, starts the cluster again and shows
// the consumer's session and its answer.
func TestConsoleSeesWhatTheConsumerLeftInTheLocalCluster(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env, dir := localClusterEnv(t)

	consumer := startProcEnv(t, "consumer-local", env, "--brokers", b.addr, "--metrics-addr", "127.0.0.1:0",
		"--partitions", fmt.Sprint(testPartitions), "--group", b.group)
	consumer.waitLog(t, "consumer running", time.Minute)
	p := prompt("s-local-demo", "hello from the demo")
	b.send(t, p)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, p.MessageID).Type)
	require.True(t, consumer.stop(t).Success(), consumer.stderr.String())
	require.Contains(t, consumer.stderr.String(), "using the local PostgreSQL cluster")
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"), "the consumer, leaving last, stopped the server")

	console := startProcEnv(t, "console-local", env, "console", "--addr", "127.0.0.1:0")
	addr := console.waitLog(t, "console serving", time.Minute)["addr"].(string)
	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body)
	}
	require.Contains(t, get("/sessions"), `href="/session?id=s-local-demo"`)
	require.Contains(t, get("/session?id=s-local-demo"), "hello from the demo")
}

// TestMigrateFindsTheLocalClusterTheConsumerLeft: a console of a newer
// release refuses the local cluster's older schema and says to run
// `consumer migrate`; without a database that command must migrate the
// local cluster, not look only at the default address.
func TestMigrateFindsTheLocalClusterTheConsumerLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env, dir := localClusterEnv(t)
	consumer := startProcEnv(t, "consumer-local", env, "--brokers", b.addr, "--metrics-addr", "127.0.0.1:0",
		"--partitions", fmt.Sprint(testPartitions), "--group", b.group)
	consumer.waitLog(t, "consumer running", time.Minute)
	require.True(t, consumer.stop(t).Success(), consumer.stderr.String())
	require.DirExists(t, dir)

	migrate := startProcEnv(t, "migrate-local", env, "migrate")
	st := migrate.waitExit(t, time.Minute)
	require.True(t, st.Success(), migrate.stderr.String())
	require.Contains(t, migrate.stderr.String(), "using the local PostgreSQL cluster")
	require.Contains(t, migrate.stderr.String(), "schema at version")
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"), "migrate, leaving last, stopped the server")
}

// localClusterEnv is the environment of processes whose local cluster is
// the test's own (their temp directory) and whose default address answers
// nothing, and the cluster's directory there.
func localClusterEnv(t *testing.T) (env []string, dir string) {
	t.Helper()
	// As root the cluster runs as "postgres", which must be able to enter
	// the temp directory.
	tmp, err := os.MkdirTemp("", "promptline-localconsole-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(tmp, 0o755))
	dir = filepath.Join(tmp, fmt.Sprintf("promptline-local-%d", os.Getuid()))
	t.Cleanup(func() {
		killServer(t, dir) // what a failed test may leave running
		require.NoError(t, os.RemoveAll(tmp))
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nothing := l.Addr().String()
	require.NoError(t, l.Close())
	return []string{"TMPDIR=" + tmp, "DATABASE_URL=", "PROMPTLINE_DATABASE_URL=", "PROMPTLINE_FAULT=",
		"PROMPTLINE_FAULT_DEFAULT_DATABASE_URL=postgres://" + nothing + "/promptline?sslmode=disable"}, dir
}

// killServer ends a server left running in dir (SIGQUIT: immediate
// shutdown), as root too, where pg_ctl would refuse to run.
func killServer(t *testing.T, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err == nil && pid > 0 {
		t.Logf("stopping the server left in %s (pid %d)", dir, pid)
		_ = syscall.Kill(pid, syscall.SIGQUIT)
	}
}
