//go:build !faults

package faults

// Hit does nothing without the faults build tag.
func Hit(string) {}

// Stall does nothing without the faults build tag.
func Stall(string) {}
