//go:build linux

package client_test

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel stop cmd when the test binary dies, even of
// SIGKILL, so that no consumer outlives its test.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
