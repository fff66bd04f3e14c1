package pgdb_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// The local cluster's tests point Open's default at an address where
// nothing listens (the fresh machine), so they run one at a time: no
// t.Parallel.

// nothingListens returns a default URL whose address refuses connections.
func nothingListens(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return fmt.Sprintf("postgres://%s/promptline?sslmode=disable", addr)
}

// localDir is a local cluster directory of the test's own, under the
// system temp directory: as root the cluster runs as "postgres", which
// must be able to enter its parent.
func localDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "promptline-localtest-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(parent, 0o755))
	dir := filepath.Join(parent, "pg")
	t.Cleanup(func() {
		// A test that failed half-way may leave the server running.
		stopServer(dir)
		require.NoError(t, os.RemoveAll(parent))
	})
	return dir
}

func stopServer(dir string) {
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		return
	}
	// Reopening as an operator and closing stops it when nobody is left.
	if db, err := pgdb.Open(context.Background(), pgdb.OpenOpts{LocalDir: dir, LocalMustExist: true, NoMigrate: true}); err == nil {
		_ = db.Close()
	}
}

func openLocal(t *testing.T, dir string, mustExist bool) (*pgdb.DB, string) {
	t.Helper()
	var logs bytes.Buffer
	db, err := pgdb.Open(t.Context(), pgdb.OpenOpts{LocalDir: dir, LocalMustExist: mustExist,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err, logs.String())
	return db, logs.String()
}

// refused says whether the server of the cluster in dir no longer
// answers at url. Its port, freed, may be taken at once by another
// server (a test of another package starting a cluster of its own, on a
// free port of its choosing): one that answers from another data
// directory is not this cluster's.
func refused(t *testing.T, url, dir string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		return true
	}
	defer func() { _ = conn.Close(t.Context()) }()
	var served string
	if err := conn.QueryRow(t.Context(), `SHOW data_directory`).Scan(&served); err != nil {
		return false // it answers, and cannot say from where: taken as this cluster's
	}
	want, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	got, err := filepath.EvalSymlinks(served)
	return err != nil || got != want
}

// `make demo`, then `consumer console`: the consumer's data outlives it.
// The first process creates the cluster and, leaving last, stops the
// server; the next starts it again from the same directory and finds the
// data; a half-made cluster from a process killed during initdb is no
// obstacle.
func TestLocalClusterKeepsItsDataAfterTheProcessLeaves(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	require.NoError(t, os.MkdirAll(dir+".init", 0o700), "what a killed initdb leaves")

	first, logs := openLocal(t, dir, false)
	require.Contains(t, logs, "no PostgreSQL on the default address")
	require.Contains(t, logs, "started=true")
	_, err := first.Pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ('s-kept', 1)`)
	require.NoError(t, err)
	require.NoError(t, first.Close())
	require.True(t, refused(t, first.URL, dir), "the last process to leave stops the server")
	require.DirExists(t, dir, "and keeps its data")
	require.NoDirExists(t, dir+".init")

	again, logs := openLocal(t, dir, true)
	require.Contains(t, logs, "started=true")
	var n int
	require.NoError(t, again.Pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions WHERE session_id = 's-kept'`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, again.Close())
	require.True(t, refused(t, again.URL, dir))
}

// A consumer and a console at once: the second finds the server running,
// the first leaving does not stop it under the second, the second leaving
// does.
func TestLocalClusterIsSharedAndTheLastToLeaveStopsIt(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	consumer, _ := openLocal(t, dir, false)
	console, logs := openLocal(t, dir, true)
	require.Contains(t, logs, "started=false")
	require.Equal(t, consumer.URL, console.URL)

	require.NoError(t, consumer.Close())
	require.False(t, refused(t, console.URL, dir), "another process still uses it")
	var n int
	require.NoError(t, console.Pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions`).Scan(&n))
	require.NoError(t, console.Close())
	require.True(t, refused(t, console.URL, dir))
}

// An operator command with nothing to inspect says what to do and creates
// nothing: an empty new cluster would only hide the mistake.
func TestOperatorCommandsNeverCreateALocalCluster(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	_, err := pgdb.Open(t.Context(), pgdb.OpenOpts{LocalDir: dir, LocalMustExist: true, NoMigrate: true})
	require.ErrorIs(t, err, pgdb.ErrNoLocalCluster)
	require.ErrorContains(t, err, "make demo")
	require.NoDirExists(t, dir)
}

// In the shared temp directory a directory of the right name proves
// nothing: one that is not private to the user who runs the cluster is
// refused, never used.
func TestLocalClusterRefusesADirectoryOthersCouldChange(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	require.NoError(t, os.Mkdir(dir, 0o755))
	_, err := pgdb.Open(t.Context(), pgdb.OpenOpts{LocalDir: dir})
	require.ErrorContains(t, err, "mode 0700")
	require.NoFileExists(t, filepath.Join(dir, "PG_VERSION"))
}

// A console that holds no connection at the moment another process leaves
// (pgxpool replaces a connection past its lifetime before it opens the next
// one; a backend may be terminated or time out) still uses the cluster: the
// process leaving must not stop the server under it.
func TestLocalClusterIsNotStoppedUnderAUserWithoutConnections(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	consumer, _ := openLocal(t, dir, false)
	console, _ := openLocal(t, dir, true)

	// The console's connections end, as they do between a lifetime's
	// replacement and the next; it does not open one before the consumer
	// leaves.
	var ended int
	require.NoError(t, consumer.Pool.QueryRow(t.Context(), `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
		  AND application_name <> current_setting('application_name')) t`).Scan(&ended))
	require.Positive(t, ended, "the console had connections to end")
	require.Eventually(t, func() bool {
		var left int
		err := consumer.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND application_name <> current_setting('application_name')`).Scan(&left)
		return err == nil && left == 0
	}, 10*time.Second, 20*time.Millisecond)

	require.NoError(t, consumer.Close())
	require.False(t, refused(t, console.URL, dir), "the console still uses the cluster")
	require.Eventually(t, func() bool {
		var n int
		return console.Pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions`).Scan(&n) == nil
	}, 10*time.Second, 20*time.Millisecond, "and can query it again")
	require.NoError(t, console.Close())
	require.True(t, refused(t, console.URL, dir), "the last to leave stops it")
}

// A process that holds the lock and never lets go (paused while it starts
// the cluster, or another user's process holding a file it made) must not
// hang the next one for good: it waits until its context ends, then says
// which file.
func TestLocalClusterLockWaitIsBounded(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	f, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	t.Cleanup(func() { f.Close() }) // lets a stuck Open go after a failure

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		db, err := pgdb.Open(ctx, pgdb.OpenOpts{LocalDir: dir})
		if err == nil {
			err = db.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorContains(t, err, dir+".lock")
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(20 * time.Second):
		require.FailNow(t, "Open still waits for a lock held for good")
	}
}

// A lock file others could write is someone else's: refused, never
// locked, so that another user cannot hold promptline's lock.
func TestLocalClusterRefusesALockFileOthersCouldChange(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	require.NoError(t, os.WriteFile(dir+".lock", nil, 0o600))
	require.NoError(t, os.Chmod(dir+".lock", 0o666))
	_, err := pgdb.Open(t.Context(), pgdb.OpenOpts{LocalDir: dir})
	require.ErrorContains(t, err, dir+".lock")
	require.NoDirExists(t, dir)
}

// A postmaster.pid left by a server that was killed names a pid the
// machine may give to another process (soon after a reboot, pids repeat):
// pg_ctl status then says the server runs, and PostgreSQL refuses to start
// over the file. The next process must see that no server of this
// directory runs, and start one.
func TestLocalClusterStartsOverAStalePidFileWhosePidLives(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	first, _ := openLocal(t, dir, false)
	_, err := first.Pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ('s-kept', 1)`)
	require.NoError(t, err)
	require.NoError(t, first.Close())
	require.True(t, refused(t, first.URL, dir))

	// The process that has the pid now, of the server's user (as root,
	// "postgres"), whom pg_ctl and PostgreSQL see alive.
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: st.Uid, Gid: st.Gid, NoSetGroups: os.Geteuid() != 0}}
	require.NoError(t, other.Start())
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	pidFile := fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n127.0.0.1\n  1234567     12\nready   \n",
		other.Process.Pid, dir, time.Now().Add(-time.Hour).Unix(), port, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(pidFile), 0o600))
	require.NoError(t, os.Chown(filepath.Join(dir, "postmaster.pid"), int(st.Uid), int(st.Gid)))

	again, logs := openLocal(t, dir, true)
	require.Contains(t, logs, "started=true")
	var n int
	require.NoError(t, again.Pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions WHERE session_id = 's-kept'`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, again.Close())
	require.True(t, refused(t, again.URL, dir))
}

// A server that does not start says why (server.log's last lines) and
// does not advise removing the directory: the data in it is kept.
func TestLocalClusterThatCannotStartSaysWhy(t *testing.T) {
	defer pgdb.SetDefaultURL(nothingListens(t))()
	dir := localDir(t)
	first, _ := openLocal(t, dir, false)
	require.NoError(t, first.Close())
	f, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString("\nshared_buffers = 'lots'\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, err = pgdb.Open(t.Context(), pgdb.OpenOpts{LocalDir: dir, LocalMustExist: true, NoMigrate: true})
	require.ErrorContains(t, err, `"shared_buffers"`, "the reason, from server.log")
	require.ErrorContains(t, err, filepath.Join(dir, "server.log"))
	require.NotContains(t, err.Error(), "remove the directory")
}
