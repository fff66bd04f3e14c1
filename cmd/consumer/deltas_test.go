package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// streamServer is an OpenAI-compatible server streaming one answer
// slowly over server-sent events; it records the Idempotency-Key of every
// request.
type streamServer struct {
	url    string
	answer string
	mu     sync.Mutex
	keys   []string
}

func newStreamServer(t *testing.T, frags []string, gap time.Duration) *streamServer {
	t.Helper()
	s := &streamServer{answer: strings.Join(frags, "")}
	h := testkit.OpenAIStreamHandler(testkit.OpenAIStreamConfig{Fragments: frags, Gap: gap, InputTokens: 3, OutputTokens: int64(len(frags))})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
		s.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *streamServer) requestKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func words(n int) []string {
	var frags []string
	for i := range n {
		frags = append(frags, fmt.Sprintf("w%02d ", i))
	}
	return frags
}

// startStreaming runs a consumer with the openai provider streaming from s.
func (b *testBundle) startStreaming(t *testing.T, name string, s *streamServer, extra ...string) *proc {
	t.Helper()
	args := []string{"--provider", "openai", "--openai-base-url", s.url, "--openai-model", "m", "--openai-stream"}
	return b.startEnv(t, name, []string{"PROMPTLINE_FAULT=", "OPENAI_API_KEY=k"}, append(args, extra...)...)
}

func deltasOf(t *testing.T, r *topicReader, session string) []envelope.Delta {
	t.Helper()
	var out []envelope.Delta
	for _, m := range r.All() {
		d, err := envelope.DecodeDelta(m.Value)
		require.NoError(t, err, "delta %s", m.Value)
		if d.SessionID == session {
			out = append(out, d)
		}
	}
	return out
}

// sendings splits a step's deltas (in topic order) at each seq 1: one
// text per sending of the step, as a UI rebuilds it.
func sendings(ds []envelope.Delta) []string {
	var out []string
	for _, d := range ds {
		if d.Seq == 1 || len(out) == 0 {
			out = append(out, "")
		}
		out[len(out)-1] += d.Text
	}
	return out
}

var (
	producerOnce sync.Once
	producerBin  string
	producerErr  error
	producerFile *os.File
)

// buildProducer builds cmd/producer once per test binary, for the tests
// that run `producer watch` as a process beside the consumers.
func buildProducer(t *testing.T) string {
	t.Helper()
	producerOnce.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			producerErr = err
			return
		}
		dir, err := filepath.Abs("../producer")
		if err != nil {
			producerErr = err
			return
		}
		tmp, err := os.MkdirTemp("", "promptline-producer-test-")
		if err != nil {
			producerErr = err
			return
		}
		// As the consumer's (buildConsumer): kept open, the directory
		// removed at once, executed through /proc/self/fd.
		defer os.RemoveAll(tmp)
		bin := filepath.Join(tmp, "producer")
		out, err := exec.Command(gobin, "build", "-o", bin, dir).CombinedOutput()
		if err != nil {
			producerErr = fmt.Errorf("go build ../producer: %w\n%s", err, out)
			return
		}
		f, err := os.Open(bin)
		if err != nil {
			producerErr = err
			return
		}
		producerFile = f
		producerBin = fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	})
	require.NoError(t, producerErr)
	return producerBin
}

// TestWatchDeltasLive runs `producer watch --deltas` as a process beside a
// consumer whose openai provider streams a slow answer: the watch prints
// the step's text as it streams, on one line, before the turn.completed
// line, and that text is the answer.
func TestWatchDeltasLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := buildProducer(t)
	const session = "s-watch-deltas"
	srv := newStreamServer(t, words(12), 100*time.Millisecond)
	b.startStreaming(t, "consumer-1", srv)

	stdout, stderr := testkit.NewSyncBuffer(), testkit.NewSyncBuffer()
	watch := exec.CommandContext(t.Context(), bin, "watch", "--brokers", b.addr, "--session", session, "--deltas",
		"--type", "turn.completed", "--count", "1", "--timeout", "60s")
	watch.Stdout, watch.Stderr = stdout, stderr
	require.NoError(t, watch.Start())
	exited := make(chan error, 1)
	go func() { exited <- watch.Wait() }()
	stderr.WaitFor(t, "and deltas on session-deltas", 30*time.Second)

	p := prompt(session, "stream please")
	b.send(t, p)
	// While the answer streams (over a second), part of it is printed
	// already: the deltas line is open, no turn.completed yet.
	require.Eventually(t, func() bool {
		return strings.HasPrefix(stdout.String(), session+` deltas step=1 "w00 `)
	}, 30*time.Second, 10*time.Millisecond, "deltas printed: %q", stdout.String())
	require.NotContains(t, stdout.String(), "turn.completed", "deltas come before the answer is committed")

	select {
	case err := <-exited:
		require.NoError(t, err, stderr.String())
	case <-time.After(60 * time.Second):
		require.FailNow(t, "watch did not end", "stdout %q stderr %q", stdout.String(), stderr.String())
	}
	require.Equal(t, fmt.Sprintf("%s deltas step=1 %q\n%s turn.completed %q\n", session, srv.answer, session, srv.answer), stdout.String())
}
