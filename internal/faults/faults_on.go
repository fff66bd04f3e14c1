//go:build faults

package faults

import (
	"os"
	"strings"
	"syscall"
	"time"
)

// point and delay are read once: fault points sit on hot paths.
var point, delay = parse(os.Getenv("PROMPTLINE_FAULT"))

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
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is delivered asynchronously; never run past the point.
	}
}
