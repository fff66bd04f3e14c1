//go:build faults

package faults

import (
	"os"
	"syscall"
)

// point is read once: fault points sit on hot paths.
var point = os.Getenv("PROMPTLINE_FAULT")

// Hit kills this process with SIGKILL when PROMPTLINE_FAULT names the point:
// no deferred function, no flush, no goodbye, as in a real crash.
func Hit(name string) {
	if point == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is delivered asynchronously; never run past the point.
	}
}

// Stall blocks the calling goroutine for good when PROMPTLINE_FAULT names
// the point, whatever its context says: a call stuck in a system call.
func Stall(name string) {
	if point == name {
		select {}
	}
}
