package pgdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The local cluster is where promptline keeps its data when no database is
// configured and the default server cannot serve it (a fresh machine, or a
// stock server that refuses this user). Unlike a throwaway cluster it
// outlives the process: the sessions `make demo` leaves are there for
// `consumer console`, `session show` and the other operator commands, which
// start it again from its data directory.
//
// Several processes may use it at once (a consumer and a console). Each
// starts the server if it is not running, and each, when it closes, stops
// it if no other process uses it; both under one lock file, so that a
// process starting never meets one stopping. A process uses the cluster
// while it holds a shared flock on usersFile in the data directory, not
// while it happens to hold a connection: an idle console's pool has none
// for a moment whenever it replaces one past its lifetime, or when a
// backend ends. A process killed with SIGKILL leaves the server running
// (the kernel drops its locks); the next one to start finds and uses it.
//
// Written here, not taken from a library: the libraries that embed Postgres
// download their own server binaries, which promptline must not do (see
// Cluster).

// LocalDir is the local cluster's data directory: promptline-local-UID in
// the system temp directory ($TMPDIR, else /tmp), so that the "postgres"
// system user, which runs it when promptline runs as root, can reach it.
func LocalDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("promptline-local-%d", os.Getuid()))
}

// ErrNoLocalCluster says that an operator command found no database: none
// configured, none usable on the default address, and no local cluster.
var ErrNoLocalCluster = errors.New("no database: set --database-url or DATABASE_URL, " +
	"or run the consumer once without one (make demo) to create the local cluster")

// localCluster is a Cluster this process uses and may have to stop.
type localCluster struct {
	*Cluster
	// app is the application_name of this handle's connections, so that
	// leaving counts only the connections of others (a psql, say).
	app string
	// users holds the shared flock on usersFile while this handle uses
	// the cluster.
	users *os.File
}

// usersFile, in the data directory, is share-locked by every process that
// uses the local cluster.
const usersFile = "promptline.users"

// openLocal starts the local cluster in dir, or finds it running; with
// mustExist it never creates one. It returns holding the lock: the caller
// releases it once its own connections are open, so that a process
// leaving in between cannot stop the server under it.
func openLocal(ctx context.Context, dir string, mustExist bool) (lc *localCluster, started bool, unlock func(), err error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, false, nil, err
	}
	c := &Cluster{Dir: dir, bin: bin}
	uid := -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, false, nil, fmt.Errorf("local PostgreSQL: running as root needs a \"postgres\" system user (PostgreSQL refuses root): %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	release, err := lockLocal(ctx, dir)
	if err != nil {
		return nil, false, nil, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	ok, err := ownedDir(dir, uid)
	switch {
	case err != nil:
		return nil, false, nil, err
	case !ok && mustExist:
		return nil, false, nil, fmt.Errorf("%w (looked for it in %s)", ErrNoLocalCluster, dir)
	case !ok:
		if err = initLocal(ctx, c, uid); err != nil {
			return nil, false, nil, err
		}
	}
	if port, running := c.runningPort(ctx); running {
		c.Port = port
		lc, err = useLocal(c)
		return lc, false, release, err
	}
	if err = c.removeStalePidFile(); err != nil {
		return nil, false, nil, err
	}
	if c.Port, err = freePort(); err != nil {
		return nil, false, nil, err
	}
	// fsync stays on: this cluster's data is kept, and a machine that
	// loses power must not leave it corrupt.
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c synchronous_commit=off -c max_connections=200", c.Port, dir)
	logFile := filepath.Join(dir, "server.log")
	// pg_ctl forks the server, which goes on starting when pg_ctl is
	// killed: a start cut short by ctx (a stop during startup) would leave
	// a server that no process uses and none would stop, and a stop sent
	// in the first instants after the fork finds no postmaster.pid yet. So
	// the start runs to its end (its own -t 60 bounds it), and a stop that
	// came meanwhile stops the server after it. Nobody else can have come
	// to use it: this process holds the lock. A start that failed on its
	// own is left as it is, as before: a server still in a long crash
	// recovery goes on, and the next process finds it running.
	startCtx, cancelStart := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	err = c.run(startCtx, "pg_ctl", "-D", dir, "-o", opts, "-l", logFile, "-w", "-t", "60", "start")
	cancelStart()
	if ctx.Err() != nil {
		stopCtx, cancelStop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = c.run(stopCtx, "pg_ctl", "-D", dir, "-m", "fast", "-w", "stop")
		cancelStop()
		return nil, false, nil, fmt.Errorf("local PostgreSQL in %s: stopped while it started: %w", dir, context.Cause(ctx))
	}
	if err != nil {
		// pg_ctl says only "Examine the log output"; the reason is there.
		// The data directory is kept: the advice is never to remove it.
		return nil, false, nil, fmt.Errorf("local PostgreSQL in %s did not start; the end of %s:\n%s\n%w",
			dir, logFile, logTail(logFile, 5), err)
	}
	if lc, err = useLocal(c); err != nil {
		// Nobody else can use a server this process just started: it
		// holds the lock.
		_ = c.run(context.WithoutCancel(ctx), "pg_ctl", "-D", dir, "-m", "fast", "-w", "stop")
		return nil, false, nil, err
	}
	return lc, true, release, nil
}

// useLocal marks this process as a user of the cluster: a shared flock on
// usersFile, held until leave. Taken under the lock, whose holder alone
// ever takes usersFile exclusively, so it never waits.
func useLocal(c *Cluster) (*localCluster, error) {
	f, err := os.OpenFile(filepath.Join(c.Dir, usersFile), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local PostgreSQL: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("local PostgreSQL: locking %s: %w", f.Name(), err)
	}
	return &localCluster{Cluster: c, app: appName(), users: f}, nil
}

// othersUse says whether another process holds usersFile. The caller
// holds the lock and has let go of its own shared flock.
func (lc *localCluster) othersUse() (bool, error) {
	f, err := os.OpenFile(filepath.Join(lc.Dir, usersFile), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, fmt.Errorf("local PostgreSQL: %w", err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("local PostgreSQL: locking %s: %w", f.Name(), err)
	}
	return false, nil // released with f, before the lock
}

// logTail is the last n lines of the file name, or why it cannot be read.
func logTail(name string, n int) string {
	b, err := os.ReadFile(name)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// initLocal creates the cluster in a new directory beside dir, then
// renames it into place: a process killed during initdb leaves no
// half-made cluster where the next one would look.
func initLocal(ctx context.Context, c *Cluster, uid int) error {
	dir := c.Dir
	tmp := dir + ".init"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("local PostgreSQL: %w", err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("local PostgreSQL: %w", err)
	}
	if uid >= 0 {
		if err := os.Chown(tmp, uid, int(c.cred.Gid)); err != nil {
			return fmt.Errorf("local PostgreSQL: %w", err)
		}
	}
	c.Dir = tmp
	err := c.run(ctx, "initdb", "-D", tmp, "-U", "promptline", "--auth=trust", "-E", "UTF8")
	c.Dir = dir
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("local PostgreSQL: %w", err)
	}
	return nil
}

// ownedDir says whether dir exists as the local cluster's directory, and
// refuses one that another user could have made or changed: in the shared
// temp directory a name alone proves nothing.
func ownedDir(dir string, uid int) (bool, error) {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("local PostgreSQL: %w", err)
	}
	if uid < 0 {
		uid = os.Geteuid()
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != uid || fi.Mode().Perm()&0o077 != 0 {
		return false, fmt.Errorf("local PostgreSQL: %s is not a directory of uid %d with mode 0700; "+
			"remove it, or set --database-url or DATABASE_URL", dir, uid)
	}
	return true, nil
}

// lockWait bounds the wait for the lock: its holder keeps it for an initdb
// and a pg_ctl start (60s at most), so one that holds it longer is paused
// or not promptline's.
const lockWait = 2 * time.Minute

// lockLocal takes the lock file beside dir; the returned function releases
// it. flock is released by the kernel when a process dies, so a SIGKILL
// never leaves it held. The file must be this user's and writable by
// nobody else: in the shared temp directory another user could have made
// it, and would then hold the lock at will. The wait ends with ctx, and
// after lockWait.
func lockLocal(ctx context.Context, dir string) (func(), error) {
	name := dir + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local PostgreSQL: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("local PostgreSQL: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		f.Close()
		return nil, fmt.Errorf("local PostgreSQL: %s is not a file of uid %d that only it can write; "+
			"remove it, or set --database-url or DATABASE_URL", name, os.Geteuid())
	}
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("local PostgreSQL: locking %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("local PostgreSQL: another process holds %s (one paused while it starts the cluster?): %w",
				name, context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// runningPort reads the port of a running server from postmaster.pid,
// after pg_ctl status says the server is alive (a stale file is left by a
// server that was killed) and the process it names is a server of this
// directory (see serves).
func (c *Cluster) runningPort(ctx context.Context) (int, bool) {
	pid, port, ok := c.postmasterPid(ctx)
	if !ok || !c.serves(pid, port) {
		return 0, false
	}
	return port, true
}

// postmasterPid reads the pid and the port from postmaster.pid when
// pg_ctl status says the process it names is alive.
func (c *Cluster) postmasterPid(ctx context.Context) (pid, port int, ok bool) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", c.Dir, "status")
	cmd.Dir = c.Dir
	// A group of its own, as Cluster.run's: killed by a terminal's Ctrl-C,
	// it would read as "no server running".
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if cmd.Run() != nil {
		return 0, 0, false
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "postmaster.pid"))
	if err != nil {
		return 0, 0, false
	}
	// Line 1 is the pid, line 4 the port (PostgreSQL's LOCK_FILE_LINE_PID
	// and LOCK_FILE_LINE_PORT).
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return 0, 0, false
	}
	port, err = strconv.Atoi(strings.TrimSpace(lines[3]))
	return pid, port, err == nil
}

// serves says whether process pid is a server of this directory: its
// working directory is the data directory (a postmaster changes into it),
// or something listens on the socket in the data directory, which only a
// server run from it makes. A killed server's pid may have gone to
// another process since (after a reboot pids repeat), which pg_ctl status
// sees alive.
func (c *Cluster) serves(pid, port int) bool {
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && sameDir(cwd, c.Dir) {
		return true
	}
	conn, err := net.DialTimeout("unix", filepath.Join(c.Dir, fmt.Sprintf(".s.PGSQL.%d", port)), 5*time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

func sameDir(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

// removeStalePidFile removes a postmaster.pid whose process is alive but
// no server of this directory (runningPort said no): PostgreSQL refuses to
// start over a lock file whose pid lives. The caller holds the lock, so no
// process of this user is starting a server here meanwhile.
func (c *Cluster) removeStalePidFile() error {
	pid, port, ok := c.postmasterPid(context.Background())
	if !ok || c.serves(pid, port) {
		return nil // no file, a dead pid (PostgreSQL starts over it), or a server after all
	}
	name := filepath.Join(c.Dir, "postmaster.pid")
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local PostgreSQL: %s names pid %d, which is no server of this directory: "+
			"remove the file: %w", name, pid, err)
	}
	return nil
}

// leave stops the server unless another process uses it (usersFile) or
// is connected to it. The count leaves out this handle's own connections,
// which the server may not have seen close yet.
func (lc *localCluster) leave() error {
	unlock, err := lockLocal(context.Background(), lc.Dir)
	if err != nil {
		lc.users.Close()
		return err
	}
	defer unlock()
	lc.users.Close()
	if others, err := lc.othersUse(); err != nil || others {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(lc.URL("postgres"))
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = lc.app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if _, running := lc.runningPort(ctx); running {
			return fmt.Errorf("local PostgreSQL: counting its users before stopping it: %w", err)
		}
		return nil // not running any more: nothing to stop
	}
	var others int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> $1`, lc.app).Scan(&others)
	_ = conn.Close(ctx)
	if err != nil || others > 0 {
		return err
	}
	return lc.run(ctx, "pg_ctl", "-D", lc.Dir, "-m", "fast", "-w", "stop")
}

func appName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("promptline %d %s", os.Getpid(), hex.EncodeToString(b))
}
