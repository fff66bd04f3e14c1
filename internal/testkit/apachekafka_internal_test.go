package testkit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApacheKafkaDiedSilently(t *testing.T) {
	k := &ApacheKafka{dir: t.TempDir()}
	exited := make(chan struct{})
	close(exited)
	k.nodes = []*node{{done: exited}}
	logs := filepath.Join(k.NodeDir(1), "logs")
	require.NoError(t, os.MkdirAll(logs, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(logs, "stdout.log"), nil, 0o644))
	require.True(t, k.diedSilently(), "exited, nothing written")

	require.NoError(t, os.WriteFile(filepath.Join(logs, "server.log"), []byte("[KafkaServer id=1] started\n"), 0o644))
	require.False(t, k.diedSilently(), "it wrote a line: its failure is the test's")

	k.nodes = []*node{{done: make(chan struct{})}}
	require.NoError(t, os.Remove(filepath.Join(logs, "server.log")))
	require.False(t, k.diedSilently(), "still running")
}
