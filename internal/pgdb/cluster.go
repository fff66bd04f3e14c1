package pgdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// ErrNoPostgres says that no database was configured, none answered on the
// default local address, and no PostgreSQL binaries were found to start one.
var ErrNoPostgres = errors.New("no PostgreSQL: set --database-url or DATABASE_URL " +
	"(e.g. postgres://user@127.0.0.1:5432/promptline), or install the PostgreSQL server " +
	"binaries (Debian/Ubuntu: apt-get install postgresql) so that initdb and pg_ctl are on PATH " +
	"or under /usr/lib/postgresql/*/bin")

// Cluster is a throwaway PostgreSQL cluster started from the machine's
// binaries, listening on loopback only. Written by hand because it is a
// dozen lines of initdb/pg_ctl; the libraries that embed Postgres download
// their own server binaries, which this must not do.
type Cluster struct {
	Dir  string // data directory
	Port int
	bin  string
	cred *syscall.Credential
}

// URL is the cluster's connection string for database db.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://promptline@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// findBinDir locates initdb and pg_ctl: on PATH, else the newest
// /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// ClusterConfig adds to a throwaway cluster's defaults.
type ClusterConfig struct {
	// Parent is where the cluster's directory goes. Defaults to the system
	// temp directory.
	Parent string
	// Files are written into the data directory before the server starts,
	// readable by the server only (e.g. "server.key" for ssl_key_file).
	// Defaults to none.
	Files map[string][]byte
	// Settings are passed as -c NAME=VALUE (e.g. ssl=on). Defaults to none.
	Settings map[string]string
}

// StartCluster initialises and starts a throwaway cluster in a new
// directory under parent (the system temp directory when empty). PostgreSQL
// refuses to run as root, so as root it runs as the "postgres" system user.
func StartCluster(ctx context.Context, parent string) (*Cluster, error) {
	return StartClusterWith(ctx, &ClusterConfig{Parent: parent})
}

// StartClusterWith is StartCluster with files and settings added.
func StartClusterWith(ctx context.Context, config *ClusterConfig) (*Cluster, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(config.Parent, "promptline-pg-")
	if err != nil {
		return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
	}
	c := &Cluster{Dir: dir, bin: bin}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: running as root needs a \"postgres\" system user (PostgreSQL refuses root): %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c.Port = port
	if err := c.run(ctx, "initdb", "-D", dir, "-U", "promptline", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, err
	}
	for name, b := range config.Files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", port, dir)
	keys := make([]string, 0, len(config.Settings))
	for k := range config.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		opts += fmt.Sprintf(" -c %s=%s", k, config.Settings[k])
	}
	if err := c.run(ctx, "pg_ctl", "-D", dir, "-o", opts, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		return nil, err
	}
	return c, nil
}

// StopWhenClosed starts a watchdog that stops the cluster and removes its
// directory once the pipe whose read end is r has no writer left: the
// process holding the write end (inherited by none of its children: Go
// opens it close-on-exec) is gone, however it ended. pg_ctl detaches the
// server, so a test binary killed by its timeout, or with SIGKILL, would
// otherwise leave its throwaway cluster running for the rest of the
// machine's life. The kernel closes a dying process's files before it
// becomes a zombie, so, unlike a watch on its pid, this needs no reaper,
// fears no reused pid and needs no sight of the process in /proc (which
// the "postgres" user it runs as under root may lack). The caller closes r
// and keeps the write end open for as long as the cluster is to live.
func (c *Cluster) StopWhenClosed(r *os.File) error {
	const script = `cat >/dev/null; "$1" -D "$2" -m immediate -w stop >/dev/null 2>&1; rm -rf "$2"`
	cmd := exec.Command("/bin/sh", "-c", script, "promptline-pg-watchdog", filepath.Join(c.bin, "pg_ctl"), c.Dir)
	cmd.Stdin = r
	// Not the caller's directory: pg_ctl fails in one it cannot read, as
	// the "postgres" user may not read root's.
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("throwaway PostgreSQL: watchdog: %w", err)
	}
	return cmd.Process.Release()
}

// Stop stops the cluster and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.run(ctx, "pg_ctl", "-D", c.Dir, "-m", "immediate", "-w", "stop")
	return errors.Join(err, os.RemoveAll(c.Dir))
}

// run runs one of the server's tools, killed when ctx ends. The tool runs
// in a process group of its own: a terminal's Ctrl-C, sent to the whole
// foreground group, reaches the caller alone, whose context then decides
// (a stop during startup is a clean stop, not a failed initdb). An error
// after ctx ended wraps ctx's cause, not the tool's "signal: killed".
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("throwaway PostgreSQL: %s was stopped: %w", name, context.Cause(ctx))
		}
		return fmt.Errorf("throwaway PostgreSQL: %s: %w\n%s", name, err, out)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
