package testkit

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel SIGKILL the node when the test binary dies
// without its Cleanup (a -timeout panic, a SIGKILL): a JVM must not outlive
// the test that started it.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
