package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// The tests of this package run the consumer as a real process: built once
// per test binary (with the faults tag, and with -race when the tests are),
// started against the test's broker and database, stopped with SIGTERM or
// killed by its own crash points.

// longRunning is what the fast tier (go test -short) leaves out here: the
// tests that run consumers as processes for seconds each. The tests of
// flags and configuration, which run the binary for a moment, stay in it.
const longRunning = "running consumer processes (crash, sweep, fault and interop tests)"

// consumerBin is the path to exec the built consumer by.
var consumerBin string

// consumerFile keeps the built binary open: its directory is removed right
// after the build (testkit.Main ends in os.Exit, so nothing could remove it
// later) and the processes are started from /proc/self/fd, which the kernel
// resolves at exec before closing this close-on-exec descriptor.
var consumerFile *os.File

func TestMain(m *testing.M) {
	if err := buildConsumer(); err != nil {
		fmt.Fprintln(os.Stderr, "building the consumer:", err)
		os.Exit(1)
	}
	testkit.Main(m)
}

func buildConsumer() error {
	var err error
	consumerFile, err = build(raceEnabled)
	if err != nil {
		return err
	}
	consumerBin = fmt.Sprintf("/proc/self/fd/%d", consumerFile.Fd())
	return nil
}

// build builds the consumer (with the race detector when race) and opens
// it; the file is removed, the open descriptor keeps it.
func build(race bool) (*os.File, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the tests need the go tool on PATH: %w", err)
	}
	dir, err := os.MkdirTemp("", "promptline-consumer-test-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "consumer")
	args := []string{"build", "-tags", "faults", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command(gobin, append(args, ".")...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return os.Open(bin)
}

// measuredBin is the consumer the tests that measure its memory run: the
// one built for the suite, or under -race one built without the detector,
// whose shadow memory (5-10x by Go's documentation, 3x measured here) a
// bound would otherwise have to allow, and with it the defect the bound
// is there to catch. The race suite checks these tests' paths for races
// in the other tests that take them. Built once, on first use.
var measuredBin = sync.OnceValues(func() (string, error) {
	if !raceEnabled {
		return consumerBin, nil
	}
	var err error
	if measuredFile, err = build(false); err != nil {
		return "", err
	}
	return fmt.Sprintf("/proc/self/fd/%d", measuredFile.Fd()), nil
})

// measuredFile holds measuredBin's descriptor open, as consumerFile does
// consumerBin's: a file no longer referenced is closed by the collector,
// and its number then names something else (seen as "fork/exec
// /proc/self/fd/33: permission denied" under -race).
var measuredFile *os.File

// proc is one running consumer process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stderr *testkit.SyncBuffer
	exited chan struct{} // closed once Wait returned
	state  *os.ProcessState
}

// startProc starts the consumer binary with args; fault names a crash
// point (PROMPTLINE_FAULT), empty for none. Cleanup stops a process that is
// still running with SIGTERM and requires it to exit 0 within 30s (else
// SIGKILL), then copies its stderr into the test log.
func startProc(t *testing.T, name, fault string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, []string{"PROMPTLINE_FAULT=" + fault}, args...)
}

// startProcEnv is startProc with variables added to the environment.
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return startBin(t, consumerBin, name, env, args...)
}

// startBin is startProcEnv with the binary to run.
func startBin(t *testing.T, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	testkit.SkipInShortTier(t, longRunning)
	p := &proc{name: name, stderr: testkit.NewSyncBuffer(), exited: make(chan struct{})}
	p.cmd = &exec.Cmd{Path: bin, Args: append([]string{"consumer"}, args...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	require.NoError(t, p.cmd.Start(), "starting %s", name)
	go func() {
		_ = p.cmd.Wait() // the outcome is in ProcessState
		p.state = p.cmd.ProcessState
		close(p.exited)
	}()
	t.Cleanup(func() {
		if !p.running() {
			t.Logf("%s (%s) stderr:\n%s", p.name, p.state, p.stderr.String())
			return
		}
		st := p.stop(t)
		t.Logf("%s (%s) stderr:\n%s", p.name, st, p.stderr.String())
		if !st.Success() {
			// The tail goes on the same line: make's filtered output of the
			// long suites keeps this line, not the log above.
			t.Errorf("%s: SIGTERM should stop the consumer cleanly, it ended with %s; its last lines: %q", p.name, st, lastLines(p.stderr.String(), 3))
		}
	})
	return p
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[max(0, len(lines)-n):]
}

// waitStarted waits, at most timeout, for the process's first output or
// its exit. A process signalled before main installed its handlers dies
// of the signal whatever its code does (a crash-sweep run stopped its
// second consumer a few milliseconds after starting it); the consumer's
// first line ("consumer starting") comes after them. It reports false
// when the timeout ran out first.
func (p *proc) waitStarted(timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for p.stderr.String() == "" {
		select {
		case <-p.stderr.Changed():
		case <-p.exited:
			return true
		case <-deadline.C:
			return false
		}
	}
	return true
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits for the exit, SIGKILL after 30s.
func (p *proc) stop(t *testing.T) *os.ProcessState {
	t.Helper()
	if !p.waitStarted(10 * time.Second) {
		t.Logf("%s wrote nothing within 10s of its start; signalling it anyway", p.name)
	}
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s did not exit within 30s of SIGTERM; killed", p.name)
	}
	return p.state
}

// waitExit waits for the process to end on its own.
func (p *proc) waitExit(t *testing.T, timeout time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.exited:
		return p.state
	case <-time.After(timeout):
		require.FailNow(t, fmt.Sprintf("%s still running after %s", p.name, timeout), p.stderr.String())
		return nil
	}
}

// requireKilled asserts that the process died of SIGKILL.
func requireKilled(t *testing.T, st *os.ProcessState) {
	t.Helper()
	ws, ok := st.Sys().(syscall.WaitStatus)
	require.True(t, ok, "wait status of %T", st.Sys())
	require.True(t, ws.Signaled(), "the process should have died of a signal, it ended with %s", st)
	require.Equal(t, syscall.SIGKILL, ws.Signal(), "the process ended with %s", st)
}

// waitLog waits for a JSON log line whose msg is msg and returns it.
func (p *proc) waitLog(t *testing.T, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if line := findLog(p.stderr.String(), msg); line != nil {
			return line
		}
		select {
		case <-p.stderr.Changed():
		case <-p.exited:
			// Wait returned: everything the process wrote is in the buffer.
			if line := findLog(p.stderr.String(), msg); line != nil {
				return line
			}
			require.FailNow(t, fmt.Sprintf("%s exited (%s) before logging %q", p.name, p.state, msg), p.stderr.String())
		case <-deadline.C:
			require.FailNow(t, fmt.Sprintf("%s: no log line %q within %s", p.name, msg, timeout), p.stderr.String())
		}
	}
}

// findLog returns the first JSON line of logs whose msg is msg.
func findLog(logs, msg string) map[string]any {
	for l := range strings.Lines(logs) {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
			return line
		}
	}
	return nil
}

const testPartitions = 4

// testBundle is what a consumer process runs against: the embedded broker
// (in this test process, so it outlives the consumers) and a fresh
// database, plus the test's own clients.
type testBundle struct {
	addr     string
	dbURL    string
	group    string
	pool     *pgxpool.Pool
	producer sarama.SyncProducer
	events   *topicReader
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	testkit.SkipInShortTier(t, longRunning)
	addr := testkit.Broker(t, testPartitions).Addr()
	pool, dbURL := testkit.Pool(t)
	b := &testBundle{addr: addr, dbURL: dbURL, group: "test-" + uuid.NewString(), pool: pool}
	b.producer = newProducer(t, addr)
	b.events = readTopic(t, addr, "session-events")
	return b
}

// start runs a consumer on the bundle's broker, database and group, with
// extra flags.
func (b *testBundle) start(t *testing.T, name, fault string, extra ...string) *proc {
	t.Helper()
	return b.startEnv(t, name, []string{"PROMPTLINE_FAULT=" + fault}, extra...)
}

// startEnv is start with variables added to the environment.
func (b *testBundle) startEnv(t *testing.T, name string, env []string, extra ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, env, b.args(extra...)...)
}

// startMeasured is start for a test that measures the consumer's memory:
// it runs measuredBin.
func (b *testBundle) startMeasured(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	bin, err := measuredBin()
	require.NoError(t, err)
	return startBin(t, bin, name, []string{"PROMPTLINE_FAULT="}, b.args(extra...)...)
}

// args is the consumer's command line for this bundle, extra appended.
func (b *testBundle) args(extra ...string) []string {
	args := []string{"--brokers", b.addr, "--database-url", b.dbURL,
		"--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(testPartitions), "--group", b.group,
		"--log-level", "debug"}
	return append(args, extra...)
}

func (b *testBundle) send(t *testing.T, p envelope.Prompt) {
	t.Helper()
	sendPrompt(t, b.producer, p)
}

// count runs a count(*) query.
func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

func newProducer(t *testing.T, addr string) sarama.SyncProducer {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("test-producer"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// sendPrompt publishes a prompt envelope with key = session.
func sendPrompt(t *testing.T, producer sarama.SyncProducer, p envelope.Prompt) {
	t.Helper()
	v, err := envelope.Marshal(p)
	require.NoError(t, err)
	_, _, err = producer.SendMessage(&sarama.ProducerMessage{
		Topic: "prompts", Key: sarama.StringEncoder(p.SessionID), Value: sarama.ByteEncoder(v),
	})
	require.NoError(t, err)
}

// topicReader collects every record of a topic, all partitions, from the
// oldest offset (testkit.TopicReader); its methods are the questions these
// tests ask of what it read.
type topicReader struct{ *testkit.TopicReader }

func readTopic(t *testing.T, addr, topic string) *topicReader {
	t.Helper()
	return readTopicWith(t, addr, kafkautil.NewConfig("test-reader"), topic)
}

// readTopicWith is readTopic with the given client configuration (TLS,
// SASL).
func readTopicWith(t *testing.T, addr string, cfg *sarama.Config, topic string) *topicReader {
	t.Helper()
	return &topicReader{testkit.ReadTopic(t, []string{addr}, topic, &testkit.TopicReaderOpts{Config: cfg})}
}

// events decodes what was read as session events, duplicates included; a
// record that does not decode or is not keyed by its session fails.
func (r *topicReader) events(t *testing.T) []envelope.Event {
	t.Helper()
	return r.Events(t)
}

func isTurn(e envelope.Event) bool {
	return e.Type == envelope.EventTurnCompleted || e.Type == envelope.EventTurnFailed
}

// turnEvents returns the turn events (completed or failed) answering msgID,
// duplicates included.
func (r *topicReader) turnEvents(t *testing.T, msgID string) []envelope.Event {
	t.Helper()
	return r.TurnEvents(t, msgID)
}

// admittedEvents returns the input.admitted events of msgID, duplicates
// included.
func (r *topicReader) admittedEvents(t *testing.T, msgID string) []envelope.Event {
	t.Helper()
	var out []envelope.Event
	for _, e := range r.events(t) {
		if e.Type == envelope.EventInputAdmitted && e.MessageID == msgID {
			out = append(out, e)
		}
	}
	return out
}

// waitTurn waits for the turn event answering msgID.
func (r *topicReader) waitTurn(t *testing.T, msgID string) envelope.Event {
	t.Helper()
	return r.WaitTurn(t, msgID, 40*time.Second)
}

// distinctIDs counts events by id: the relay publishes at least once, and
// consumers deduplicate on the id.
func distinctIDs(evs []envelope.Event) int {
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.ID] = true
	}
	return len(seen)
}

// prompt returns a queued prompt with fresh IDs scoped to the test.
func prompt(session, text string) envelope.Prompt {
	return envelope.Prompt{MessageID: "m-" + uuid.NewString(), SessionID: session, Text: text}
}
