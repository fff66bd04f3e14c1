//go:build faults

package faults

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Enabled is true with the faults build tag.
const Enabled = true

// point and delay are read once: fault points sit on hot paths.
var point, delay = parse(os.Getenv("PROMPTLINE_FAULT"))

// DefaultDatabaseURL replaces the default local server's address when
// PROMPTLINE_FAULT_DEFAULT_DATABASE_URL is set, so that a test can make a
// process meet an unusable default server whatever answers on the
// machine's 127.0.0.1:5432.
func DefaultDatabaseURL() string { return os.Getenv("PROMPTLINE_FAULT_DEFAULT_DATABASE_URL") }

// parse splits "point" or "point@duration".
func parse(v string) (string, time.Duration) {
	name, after, ok := strings.Cut(v, "@")
	if !ok {
		return v, 0
	}
	d, err := time.ParseDuration(after)
	if err != nil {
		panic("PROMPTLINE_FAULT: " + err.Error())
	}
	return name, d
}

// Hit kills this process with SIGKILL when PROMPTLINE_FAULT names the point:
// no deferred function, no flush, no goodbye, as in a real crash. With a
// delay (PROMPTLINE_FAULT=point@1s) the calling goroutine stops at the
// point for that long first while the rest of the process runs on (so that
// background work, such as the consumer's periodic offset commit, gets its
// chance to run inside the window).
func Hit(name string) {
	if point == name {
		if delay > 0 {
			time.Sleep(delay)
		}
		die()
	}
}

// Crash kills this process with SIGKILL at once, whatever PROMPTLINE_FAULT
// says: for a test input that crashes every process that runs it (the
// scripted provider's /crash).
func Crash() { die() }

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is delivered asynchronously; never run past the point.
}

// The commit boundary. PROMPTLINE_FAULT_COMMIT is "N:before" or "N:after"
// (N counts from 1); PROMPTLINE_FAULT_COMMIT_LOG names a file that gets one
// line per commit, "N LABEL", written before the commit is sent (so the
// line of the commit a process died at is there too).
var (
	commitAt, commitWhen = parseCommit(os.Getenv("PROMPTLINE_FAULT_COMMIT"))
	commitLog            = openCommitLog(os.Getenv("PROMPTLINE_FAULT_COMMIT_LOG"))
	commits              atomic.Int64
	logMu                sync.Mutex
)

func parseCommit(s string) (int64, string) {
	if s == "" {
		return 0, ""
	}
	n, when, _ := strings.Cut(s, ":")
	at, err := strconv.ParseInt(n, 10, 64)
	if err != nil || at < 1 || (when != "before" && when != "after") {
		fmt.Fprintf(os.Stderr, "PROMPTLINE_FAULT_COMMIT=%q: want N:before or N:after (N >= 1)\n", s)
		os.Exit(2)
	}
	return at, when
}

func openCommitLog(path string) *os.File {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "PROMPTLINE_FAULT_COMMIT_LOG: %v\n", err)
		os.Exit(2)
	}
	return f
}

// BeforeCommit counts a commit about to be sent and returns its number;
// it kills the process when that is the commit PROMPTLINE_FAULT_COMMIT
// names with "before": the commit is never sent.
func BeforeCommit(label string) int64 {
	n := commits.Add(1)
	if commitLog != nil {
		logMu.Lock()
		fmt.Fprintf(commitLog, "%d %s\n", n, label)
		logMu.Unlock()
	}
	if n == commitAt && commitWhen == "before" {
		die()
	}
	return n
}

// AfterCommit kills the process when commit n, whose outcome the client
// has just received, is the one PROMPTLINE_FAULT_COMMIT names with "after":
// the commit is durable, nothing that follows it has run.
func AfterCommit(n int64, _ string) {
	if n == commitAt && commitWhen == "after" {
		die()
	}
}

// Stall blocks the calling goroutine for good when PROMPTLINE_FAULT names
// the point, whatever its context says: a call stuck in a system call.
func Stall(name string) {
	if point == name {
		select {}
	}
}
