//go:build !linux

package pgdb

import (
	"syscall"
	"time"
)

// userTimeout does nothing where TCP_USER_TIMEOUT does not exist: there,
// keepalives and the writers' own deadlines bound the wait.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
