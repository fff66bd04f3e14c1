package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// The terminal bar counts what was acknowledged and, when a send stops
// short of the total, Finish still returns (an unfinished bar must not
// hang the producer).
func TestBarProgress(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	p := newBarProgress(&out, 10)
	p.Add(3)
	p.Add(4)
	p.Finish()
	require.Contains(t, out.String(), "sending")
	require.Contains(t, out.String(), "7/10 prompts")
}
