//go:build !linux

package testkit

import "os/exec"

// dieWithTest has no portable equivalent of Linux's parent-death signal:
// elsewhere a node outlives a test binary that died without its Cleanup.
func dieWithTest(*exec.Cmd) {}
