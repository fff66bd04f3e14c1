package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// silentListener accepts TCP connections and never answers on them, as a
// server that hangs; accepted receives at the first connection.
func silentListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(ch) })
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), ch
}

// A SIGTERM is the normal stop of the service, whenever it comes: one
// that comes while the consumer still starts (here, while it waits for a
// dependency that does not answer) stops it at once and cleanly, exit 0,
// not with "context canceled" and exit 1 (which an orchestrator counts as
// a crash, and which failed a crash-sweep run whose second process was
// stopped while it connected).
func TestSigtermDuringStartupStopsCleanly(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, testPartitions).Addr()
	_, dbURL := testkit.Pool(t)
	for _, tc := range []struct {
		name string
		hang func(b *testBundle, silent string)
	}{
		{"postgres", func(b *testBundle, silent string) {
			b.dbURL = "postgres://u:p@" + silent + "/db?sslmode=disable&connect_timeout=60"
		}},
		{"kafka", func(b *testBundle, silent string) { b.addr = silent }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			silent, accepted := silentListener(t)
			b := &testBundle{addr: addr, dbURL: dbURL, group: "test-" + uuid.NewString()}
			tc.hang(b, silent)
			p := b.start(t, "consumer", "")
			select {
			case <-accepted:
			case <-time.After(60 * time.Second):
				require.FailNow(t, "the consumer never connected to the silent "+tc.name, p.stderr.String())
			}
			signalled := time.Now()
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			// Postgres and Sarama's constructors end at the signal; the
			// broker watch's metadata read in flight does not (Sarama's
			// takes no context, and ends at its read timeouts: 9s and 27s
			// were measured against a silent broker), and the watch's Stop waits for
			// it, so that nothing it opened outlives the process's stop.
			st := p.waitExit(t, 90*time.Second)
			t.Logf("exited %s after the signal", time.Since(signalled).Round(time.Millisecond))
			require.True(t, st.Success(), "SIGTERM during startup should stop the consumer cleanly, it ended with %s\n%s", st, p.stderr.String())
			require.NotNil(t, findLog(p.stderr.String(), "consumer stopped during startup"), p.stderr.String())
		})
	}
}

// childOf is the pid of a child of ppid whose command is name and whose
// arguments include arg, or 0.
func childOf(ppid int, name, arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if l < 0 || r < 0 || r+2 > len(s) {
			continue
		}
		f := strings.Fields(s[r+2:]) // state, ppid, ...
		if s[l+1:r] != name || len(f) < 2 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cl), "\x00"+arg+"\x00") || strings.HasSuffix(string(cl), "\x00"+arg) {
			return pid
		}
	}
	return 0
}

// A SIGTERM while the consumer starts its local cluster (no database URL:
// the demo's way) is a clean stop too. Its initdb or pg_ctl, killed as the
// start was stopped, made the error "signal: killed", which is no
// cancellation: exit 1, with initdb's whole output. And pg_ctl had forked
// the server, which went on starting with no process using it, and none
// to stop it. Now: exit 0, no server left running, no half-made cluster,
// and the next process uses the cluster.
func TestSigtermWhileLocalClusterStarts(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, testPartitions).Addr()
	for _, tc := range []struct{ tool, arg string }{{"initdb", "-D"}, {"pg_ctl", "start"}} {
		t.Run(tc.tool, func(t *testing.T) {
			t.Parallel()
			env, dir := localClusterEnv(t)
			args := []string{"--brokers", addr, "--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(testPartitions), "--group", "test-" + uuid.NewString()}
			if tc.tool == "pg_ctl" { // a cluster made, not running
				first := startProcEnv(t, "consumer-local-first", env, args...)
				first.waitLog(t, "consumer running", 2*time.Minute)
				require.True(t, first.stop(t).Success(), first.stderr.String())
				require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"))
			}
			p := startProcEnv(t, "consumer-local", env, args...)
			require.Eventually(t, func() bool { return childOf(p.cmd.Process.Pid, tc.tool, tc.arg) != 0 },
				time.Minute, time.Millisecond, "no %s %s seen\n%s", tc.tool, tc.arg, p.stderr.String())
			if tc.tool == "pg_ctl" { // the server forked and wrote its lock file; pg_ctl waits for it
				pidFile := filepath.Join(dir, "postmaster.pid")
				require.Eventually(t, func() bool { _, err := os.Stat(pidFile); return err == nil },
					time.Minute, time.Millisecond, "no server started")
			}
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			st := p.waitExit(t, time.Minute)
			require.True(t, st.Success(), "SIGTERM while the local cluster starts: %s\n%s", st, p.stderr.String())
			require.NotNil(t, findLog(p.stderr.String(), "consumer stopped during startup"), p.stderr.String())
			require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"), "no process uses the cluster, and its server runs")

			if tc.tool == "initdb" { // no half-made cluster where the next start looks
				require.NoDirExists(t, dir)
				require.NoDirExists(t, dir+".init")
				return
			}
			migrate := startProcEnv(t, "migrate-local", env, "migrate")
			require.True(t, migrate.waitExit(t, 2*time.Minute).Success(), "the next process uses the cluster\n%s", migrate.stderr.String())
		})
	}
}
