package testkit

import "testing"

// SkipInShortTier skips t under `go test -short` (make test/short, the
// fast tier of docs/testing.md), saying what it needs. It is the only skip
// the suite allows: without -short (make test, .ci/run) it does nothing,
// and a missing tool then fails the test, as it must.
func SkipInShortTier(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: run make test", needs)
	}
}
