//go:build !faults

package faults

// Enabled is false without the faults build tag: callers compile their
// fault hooks away.
const Enabled = false

// Hit does nothing without the faults build tag.
func Hit(string) {}

// BeforeCommit does nothing without the faults build tag.
func BeforeCommit(string) int64 { return 0 }

// AfterCommit does nothing without the faults build tag.
func AfterCommit(int64, string) {}

// Crash does nothing without the faults build tag.
func Crash() {}

// Stall does nothing without the faults build tag.
func Stall(string) {}

// DefaultDatabaseURL is "" without the faults build tag: the default
// server's address is fixed.
func DefaultDatabaseURL() string { return "" }
