//go:build chaos

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
)

// The chaos soak (docs/testing.md, "Chaos soak"; make chaos): three
// consumer processes in one group, a standalone broker process on a data
// directory, Postgres behind the proxy of the database-fault tests; the
// crash sweep's kinds of prompts over many sessions at a steady rate while
// random faults hit for CHAOS_DURATION (default 60s): SIGKILL and restart
// of a consumer, SIGSTOP past the lease then SIGCONT (a zombie), SIGKILL
// and restart of the broker on its data directory and port, connection
// cuts and stalls through the proxy. Once the faults stop and the system
// is quiescent, a checker reads session-events, prompts.rejects and
// Postgres and prints a table; the run fails if a must-be-0 figure is not
// 0 or if no fault hit work in flight.
//
// It runs under the chaos build tag only (make chaos sets it), so that the
// default suite neither runs nor skips it. CHAOS_SEED fixes the random
// choices (printed). With PROMPTLINE_TEST_KAFKA=apache (make chaos/kafka,
// part of make test/kafka) the broker is a node of Apache Kafka instead:
// the broker-restart fault SIGKILLs its JVM and starts it again on its
// data directory and port.

const chaosLease = 2 * time.Second

// chaos is one soak: the processes, the clients and what was sent.
type chaos struct {
	t       *testing.T
	r       *sweepRun // workload helpers, responder, invariants
	started time.Time
	rng     *rand.Rand
	rngMu   sync.Mutex

	brokerDir  string
	brokerAddr string
	broker     *proc                // the embedded broker's process
	kafka      *testkit.ApacheKafka // or Apache Kafka's node (PROMPTLINE_TEST_KAFKA=apache)
	proxy      *pgproxy.Proxy
	flags      []string
	consumers  [3]*proc
	owners     [3]string
	restarts   int
	unexpected []string // consumer or broker exits the soak did not cause

	mu         sync.Mutex
	sends      int
	duplicates int
	conflicts  map[string]string // message ID -> the original's text
	faults     []chaosFault
	retried    []envelope.Prompt // resume:false prompts waiting for their retry
}

type chaosFault struct {
	at       time.Duration
	kind     string
	target   string
	inFlight int // live claims (of the target process, or all) when it hit
}

func (c *chaos) intn(n int) int {
	c.rngMu.Lock()
	defer c.rngMu.Unlock()
	return c.rng.IntN(n)
}

func (c *chaos) logf(format string, args ...any) {
	c.t.Logf("chaos %7.2fs "+format, append([]any{time.Since(c.started).Seconds()}, args...)...)
}

// apache says whether the soak's broker is Apache Kafka.
func (c *chaos) apache() bool { return testkit.ApacheKafkaEnabled() }

// patience is how long a client waits for the broker to come back: a
// JVM's start on a busy machine takes up to testkit's start timeout, the
// embedded broker's a second.
func (c *chaos) patience() time.Duration {
	if c.apache() {
		return testkit.ApacheKafkaStartTimeout + time.Minute
	}
	return 90 * time.Second
}

// startBroker starts the broker on the data directory and, once known,
// the same address: the embedded broker's process, or Apache Kafka's
// node (the first time with promptline's topics; restarted on its data
// directory after killBroker).
func (c *chaos) startBroker() {
	if c.apache() {
		if c.kafka != nil {
			require.NoError(c.t, c.kafka.RestartNode(1))
			return
		}
		c.kafka = testkit.StartApacheKafka(c.t, 1)
		c.brokerAddr = c.kafka.Addr()
		admin, err := sarama.NewClusterAdmin(c.kafka.Addrs(), kafkautil.NewConfig("chaos-topics"))
		require.NoError(c.t, err)
		defer admin.Close()
		_, err = kafkautil.EnsureTopics(admin, kafkautil.Topics{}.WithDefaults(), testPartitions, 1, nil)
		require.NoError(c.t, err)
		return
	}
	addr := cmp.Or(c.brokerAddr, "127.0.0.1:0")
	c.broker = startProc(c.t, "broker", "", "broker", "--addr", addr, "--data-dir", c.brokerDir,
		"--partitions", fmt.Sprint(testPartitions))
	ready := c.broker.waitLog(c.t, "embedded broker ready", 60*time.Second)
	c.brokerAddr, _ = ready["addr"].(string)
	require.NotEmpty(c.t, c.brokerAddr)
}

// killBroker SIGKILLs the broker and waits until it has exited.
func (c *chaos) killBroker() {
	if c.apache() {
		c.kafka.KillNode(1)
		return
	}
	require.NoError(c.t, c.broker.cmd.Process.Kill())
	requireKilled(c.t, c.broker.waitExit(c.t, 10*time.Second))
}

// brokerExited says why the broker is not running when the soak did not
// stop it, or "" while it runs.
func (c *chaos) brokerExited() string {
	if c.apache() {
		if !c.kafka.NodeRunning(1) {
			return "the Apache Kafka node exited on its own (server.log in " + c.kafka.NodeDir(1) + ")"
		}
		return ""
	}
	if !c.broker.running() {
		return fmt.Sprintf("the broker exited on its own (%s)", c.broker.state)
	}
	return ""
}

// startConsumer starts consumer i and waits until its first join of the
// group is complete (Setup logs "partitions assigned"): see joined.
func (c *chaos) startConsumer(i int) {
	p := c.r.b.start(c.t, fmt.Sprintf("consumer-%d", i+1), "", c.flags...)
	line := p.waitLog(c.t, "consumer running", 60*time.Second)
	c.owners[i], _ = line["owner"].(string)
	c.consumers[i] = p
	c.joined(p, 0)
}

// joined waits until p has logged "partitions assigned" more than before
// times. The broker's group coordinator (kfake) has a defect no fault of
// the real Kafka has: a member that joins as new (a process's first join,
// or a rejoin after the broker forgot it) and dies before its JoinGroup
// answer is sent stays in the group with no session timer, for good; its
// partitions are assigned to it at every rebalance and never consumed,
// and every later join waits the rebalance timeout for it. Kafka times
// out such a member (KAFKA-7610) and schedules every member's session
// expiry when a join completes. So the soak kills a consumer only once
// its join is complete: after its start and after a broker restart.
// Apache Kafka has not got the defect, so on it the soak does not wait: a
// consumer may be killed in any join, as in production.
func (c *chaos) joined(p *proc, before int) {
	if c.apache() {
		return
	}
	deadline := time.NewTimer(90 * time.Second) // rebalances wait for dead members' sessions (10s) and load
	defer deadline.Stop()
	for countMsgs(p.stderr.String(), "partitions assigned") <= before {
		select {
		case <-p.stderr.Changed():
		case <-p.exited:
			require.FailNow(c.t, fmt.Sprintf("%s exited (%s) before joining the group", p.name, p.state), p.stderr.String())
		case <-deadline.C:
			require.FailNow(c.t, fmt.Sprintf("%s: no partitions assigned within 90s", p.name), p.stderr.String())
		}
	}
}

// countMsgs counts the JSON lines of logs whose msg is msg.
func countMsgs(logs, msg string) int {
	n := 0
	for l := range strings.Lines(logs) {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
			n++
		}
	}
	return n
}

// send publishes a record, retrying while the broker is away.
func (c *chaos) send(topic, key string, value []byte) {
	deadline := time.Now().Add(c.patience())
	retry := time.NewTicker(200 * time.Millisecond) // while the broker it restarts is away
	defer retry.Stop()
	for {
		_, _, err := c.r.b.producer.SendMessage(&sarama.ProducerMessage{
			Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(value),
		})
		if err == nil {
			c.mu.Lock()
			c.sends++
			c.mu.Unlock()
			return
		}
		require.True(c.t, time.Now().Before(deadline), "sending to %s: %v", topic, err)
		<-retry.C
	}
}

func (c *chaos) sendPrompt(p envelope.Prompt) {
	v, err := envelope.Marshal(p)
	require.NoError(c.t, err)
	c.send("prompts", p.SessionID, v)
}

// expect records a prompt that must end in one turn.
func (c *chaos) expect(kind, text string) envelope.Prompt {
	p := envelope.Prompt{
		MessageID: "m-" + uuid.NewString(), SessionID: c.r.session(fmt.Sprintf("%s-%d", kind, c.intn(6))), Text: text,
	}
	c.r.mu.Lock()
	c.r.prompts = append(c.r.prompts, p)
	c.r.mu.Unlock()
	return p
}

// scenario sends one piece of the workload, chosen at random.
func (c *chaos) scenario() {
	tag := uuid.NewString()[:8]
	c.r.mu.Lock()
	earlier := len(c.r.prompts)
	c.r.mu.Unlock()
	x := c.intn(20)
	if earlier == 0 && x >= 15 && x < 18 {
		x = 0 // no earlier prompt to duplicate or reuse yet
	}
	switch {
	case x < 5:
		c.sendPrompt(c.expect("plain", "hello "+tag))
	case x < 8:
		c.sendPrompt(c.expect("tools", fmt.Sprintf(`/tool append_line {"file":"sweep.txt","line":"tools-%[1]s"}
/tool echo {"text":"idempotent"}
/tool http_request {"endpoint":"side","body":{"call":"side-%[1]s"}}
/tool http_request {"endpoint":"idem","body":{"call":"idem-%[1]s"}}`, tag)))
	case x < 10:
		long := c.expect("steer", "/sleep 700ms\nlong "+tag)
		c.sendPrompt(long)
		steer := c.expect("steer", "steered "+tag)
		steer.SessionID, steer.Delivery = long.SessionID, envelope.DeliverySteer
		c.r.mu.Lock()
		c.r.prompts[len(c.r.prompts)-1] = steer
		c.r.mu.Unlock()
		c.sendPrompt(steer)
	case x < 13:
		kind := []string{"approve", "decline", "feedback"}[x-10]
		c.sendPrompt(c.expect(kind, fmt.Sprintf(`/tool append_line {"file":"sweep.txt","line":"%s-%s"}`, kind, tag)))
	case x < 14:
		c.sendPrompt(c.expect("limit", `/loop echo {"text":"once more"}`))
	case x < 15:
		c.sendPrompt(c.expect("fail", "/fail the provider is down "+tag))
	case x < 17:
		// An exact duplicate of an earlier prompt.
		c.r.mu.Lock()
		p := c.r.prompts[c.intn(len(c.r.prompts))]
		c.r.mu.Unlock()
		c.sendPrompt(p)
		c.mu.Lock()
		c.duplicates++
		c.mu.Unlock()
	case x < 18:
		// A conflicting reuse of an earlier prompt's ID: sent after the
		// original was acknowledged, on the same partition (same key), so
		// the original is admitted first.
		c.r.mu.Lock()
		p := c.r.prompts[c.intn(len(c.r.prompts))]
		c.r.mu.Unlock()
		c.mu.Lock()
		_, seen := c.conflicts[p.MessageID]
		if !seen {
			c.conflicts[p.MessageID] = p.Text
		}
		c.mu.Unlock()
		if !seen {
			p.Text = "a conflicting reuse " + tag
			c.sendPrompt(p)
		}
	default:
		// resume:false now, its retry with resume:true at a later tick.
		p := c.expect("resume", "held back "+tag)
		held := p
		held.Resume = new(bool)
		c.sendPrompt(held)
		c.mu.Lock()
		c.retried = append(c.retried, p)
		c.mu.Unlock()
	}
	c.mu.Lock()
	var retry []envelope.Prompt
	if len(c.retried) > 2 {
		retry, c.retried = c.retried[:1], c.retried[1:]
	}
	c.mu.Unlock()
	for _, p := range retry {
		c.sendPrompt(p)
	}
}

// flushRetries sends the retries still held back.
func (c *chaos) flushRetries() {
	c.mu.Lock()
	retry := c.retried
	c.retried = nil
	c.mu.Unlock()
	for _, p := range retry {
		c.sendPrompt(p)
	}
}

// eventIndex decodes the records of a topicReader once each.
type eventIndex struct {
	r      *topicReader
	events []envelope.Event
}

func (x *eventIndex) update(t *testing.T) []envelope.Event {
	msgs := x.r.Since(len(x.events))
	for _, m := range msgs {
		e, err := envelope.DecodeEvent(m.Value)
		require.NoError(t, err, "session event %s", m.Value)
		x.events = append(x.events, e)
	}
	return x.events[len(x.events)-len(msgs):]
}

// respond answers new permission.asked events until stop is closed.
func (c *chaos) respond(stop <-chan struct{}) {
	idx := &eventIndex{r: c.r.b.events}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, e := range idx.update(c.t) {
			if reply, ok := c.r.reply(e); ok {
				c.send("permission-replies", e.SessionID, replyJSON(c.t, reply))
			}
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// inFlight counts live claims, of owner when not empty.
func (c *chaos) inFlight(owner string) int {
	if owner == "" {
		return c.r.b.count(c.t, `SELECT count(*) FROM claims`)
	}
	return c.r.b.count(c.t, `SELECT count(*) FROM claims WHERE owner_id = $1`, owner)
}

// aim waits, up to 3s, for a moment when owner (any process when empty)
// holds a claim, so that most faults hit a turn in flight; it returns the
// claims then (0 if none came).
func (c *chaos) aim(owner string) int {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if n := c.inFlight(owner); n > 0 || time.Now().After(deadline) {
			return n
		}
		<-time.After(5 * time.Millisecond) // a poll's pace
	}
}

func (c *chaos) fault(kind, target string, inFlight int) {
	f := chaosFault{at: time.Since(c.started), kind: kind, target: target, inFlight: inFlight}
	c.mu.Lock()
	c.faults = append(c.faults, f)
	c.mu.Unlock()
	c.logf("fault %-14s %-11s claims in flight: %d", kind, target, inFlight)
}

// watchExits restarts a consumer that ended without the soak killing it
// (its supervisor would): it is counted, not hidden.
func (c *chaos) watchExits() {
	for i, p := range c.consumers {
		if !p.running() {
			c.unexpected = append(c.unexpected, fmt.Sprintf("%s exited on its own (%s)", p.name, p.state))
			c.logf("%s exited on its own (%s); restarting it", p.name, p.state)
			c.startConsumer(i)
		}
	}
	if why := c.brokerExited(); why != "" {
		c.unexpected = append(c.unexpected, why)
		c.startBroker()
	}
}

// injectOne hits the system with one random fault and waits until it is
// over (the victim restarted or resumed).
func (c *chaos) injectOne() {
	c.watchExits()
	i := c.intn(3)
	p := c.consumers[i]
	switch x := c.intn(10); {
	case x < 3:
		c.fault("sigkill", p.name, c.aim(c.owners[i]))
		require.NoError(c.t, p.cmd.Process.Kill())
		requireKilled(c.t, p.waitExit(c.t, 10*time.Second))
		c.restarts++
		c.startConsumer(i)
	case x < 5:
		// Paused past its lease: recovery takes its claims over; resumed,
		// every write it tries must be fenced.
		pause := chaosLease + time.Duration(500+c.intn(2500))*time.Millisecond
		c.fault("sigstop", p.name, c.aim(c.owners[i]))
		require.NoError(c.t, p.cmd.Process.Signal(syscall.SIGSTOP))
		<-time.After(pause) // the fault's duration, not a synchronisation
		require.NoError(c.t, p.cmd.Process.Signal(syscall.SIGCONT))
		c.logf("sigcont        %-11s after %s", p.name, pause.Round(time.Millisecond))
	case x < 6:
		c.fault("broker-restart", "broker", c.aim(""))
		var assigned [3]int
		for i, p := range c.consumers {
			assigned[i] = countMsgs(p.stderr.String(), "partitions assigned")
		}
		down := time.Now()
		c.killBroker()
		c.startBroker()
		c.logf("broker back    after %s", time.Since(down).Round(time.Millisecond))
		for i, p := range c.consumers {
			c.joined(p, assigned[i]) // each session ended with the broker
		}
	case x < 8:
		n := c.aim("")
		if c.intn(2) == 0 {
			c.fault("pg-cut-all", "postgres", n)
			c.proxy.CutAll()
		} else {
			c.fault("pg-cut-one", "postgres", n)
			c.proxy.CutOne(c.intn)
		}
	default:
		c.fault("pg-stall", "postgres", c.aim(""))
		c.proxy.StallNextInTx(time.Duration(300+c.intn(2500)) * time.Millisecond)
	}
}

func TestChaosSoak(t *testing.T) {
	duration := time.Minute
	if s := os.Getenv("CHAOS_DURATION"); s != "" {
		var err error
		duration, err = time.ParseDuration(s)
		require.NoError(t, err, "CHAOS_DURATION")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err, "CHAOS_SEED")
	}
	c := &chaos{t: t, started: time.Now(), rng: rand.New(rand.NewPCG(seed, seed)), brokerDir: t.TempDir(),
		conflicts: map[string]string{}}
	c.startBroker()

	pool, dbURL := testkit.Pool(t)
	proxy, proxied := pgproxy.StartFor(t, dbURL)
	c.proxy = proxy
	proxy.SetLatency(time.Millisecond)
	b := &testBundle{addr: c.brokerAddr, dbURL: proxied, group: "chaos-" + uuid.NewString(), pool: pool}
	b.producer = newProducer(t, b.addr)
	b.events = readTopic(t, b.addr, "session-events")
	tools, url := newToolServer(t)
	c.r = &sweepRun{b: b, sandbox: t.TempDir(), tools: tools, toolURL: url, tag: uuid.NewString()[:8], replied: map[string]bool{}}
	// No recovery cap: the soak's faults hit sessions at random, often
	// several times a minute each, and every turn must end; the cap is for
	// a turn that crashes its own process (TestRecoveryCapStopsACrashLoop).
	c.flags = append(sweepFlags(c.r.sandbox, url), "--lease", chaosLease.String(), "--db-lock-timeout", "500ms",
		"--log-level", "info", "--recovery-max-per-session", "0")
	for i := range c.consumers {
		c.startConsumer(i)
	}
	c.logf("started: broker %s (%s), 3 consumers, CHAOS_DURATION=%s CHAOS_SEED=%d", c.brokerAddr,
		cmp.Or(os.Getenv(testkit.KafkaEnv), "embedded"), duration, seed)

	stopRespond := make(chan struct{})
	responded := make(chan struct{})
	go func() { defer close(responded); c.respond(stopRespond) }()

	// The workload: a scenario every 250ms until the faults are over.
	stopLoad := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopLoad:
				return
			case <-tick.C:
				c.scenario()
			}
		}
	}()

	// The faults, one at a time, 1-4s apart, for the duration.
	faultsEnd := time.Now().Add(duration)
	for time.Now().Before(faultsEnd) {
		<-time.After(time.Duration(1000+c.intn(3000)) * time.Millisecond) // the pace of the faults
		c.injectOne()
	}
	close(stopLoad)
	<-loaded
	c.flushRetries()
	c.watchExits()
	c.logf("faults over: %d injected; quiescing", len(c.faults))

	// Quiescence: no claim, no waiting input, no unpublished outbox row,
	// no pending permission request, a turn event for every prompt.
	idx := &eventIndex{r: b.events}
	turned := map[string]bool{}
	quiesce := 3 * time.Minute
	if c.apache() {
		quiesce = 5 * time.Minute // rebalances wait for dead members' sessions, a JVM is slow on a busy machine
	}
	deadline := time.Now().Add(quiesce)
	tick := time.NewTicker(500 * time.Millisecond)
	for {
		for _, e := range idx.update(t) {
			if isTurn(e) {
				for _, id := range e.MessageIDs {
					turned[id] = true
				}
			}
		}
		why := c.r.busyState(t)
		for _, p := range c.r.prompts {
			if why == "" && !turned[p.MessageID] {
				why = "no turn event for " + p.MessageID + " (" + p.SessionID + ")"
			}
		}
		if why == "" {
			break
		}
		require.True(t, time.Now().Before(deadline), "not quiescent %s after the faults: %s", quiesce, why)
		<-tick.C
	}
	tick.Stop()
	close(stopRespond)
	<-responded
	c.logf("quiescent")

	figures, failures := c.check()
	t.Logf("chaos soak (%s), CHAOS_DURATION=%s CHAOS_SEED=%d, %s in all\n%s", cmp.Or(os.Getenv(testkit.KafkaEnv), "embedded"), duration, seed,
		time.Since(c.started).Round(time.Second), figures)
	for _, p := range c.consumers {
		p.stop(t)
	}
	require.Empty(t, failures)
}

// busyState is busy without the turn events (the caller checks those
// against an index of the events).
func (r *sweepRun) busyState(t *testing.T) string {
	saved := r.prompts
	r.prompts = nil
	defer func() { r.prompts = saved }()
	return r.busy(t)
}

// zombieWritesSQL counts rows written by an execution after recovery took
// its claim over: a row of execution E with E's fencing token
// (recoveries.token_before) inserted, or (messages and attempts) finished
// in a state only the execution itself sets, by a transaction that began
// after the decision's (decided_at is now() of the takeover's
// transaction; every write of E begins with its conditional statement on
// the claim, so a transaction of E that began after the takeover must
// have been fenced). Recovery's own marks carry decided_at itself. A tool
// call's later updates are left out: the execution that resumes a turn
// after a permission reply, or continues it, dispatches the calls
// requested under E's rows (E's token stays on them), as the first
// 10-minute soak showed.
const zombieWritesSQL = `
SELECT
  (SELECT count(*) FROM recoveries r JOIN messages m ON m.execution_id = r.execution_id AND m.fencing_token = r.token_before
    WHERE m.created_at > r.decided_at OR (m.status = 'completed' AND m.completed_at > r.decided_at))
+ (SELECT count(*) FROM recoveries r JOIN attempts a ON a.execution_id = r.execution_id AND a.fencing_token = r.token_before
    WHERE a.started_at > r.decided_at OR (a.state IN ('succeeded', 'failed') AND a.finished_at > r.decided_at))
+ (SELECT count(*) FROM recoveries r JOIN tool_calls c ON c.execution_id = r.execution_id AND c.fencing_token = r.token_before
    WHERE c.requested_at > r.decided_at)`

// check reads session-events and prompts.rejects afresh from the broker,
// and Postgres, and returns the table and the must-be-0 figures that are not.
func (c *chaos) check() (string, []string) {
	t, b := c.t, c.r.b
	var failures []string
	var rows [][2]string
	row := func(name string, v any) { rows = append(rows, [2]string{name, fmt.Sprint(v)}) }
	must0 := func(name string, n int, detail []string) {
		row(name+" (must be 0)", n)
		if n != 0 {
			failures = append(failures, fmt.Sprintf("%s: %d: %s", name, n, strings.Join(detail, "; ")))
		}
	}

	var events []envelope.Event
	for _, m := range testkit.ReadAll(t, c.brokerAddr, "session-events") {
		e, err := envelope.DecodeEvent(m.Value)
		require.NoError(t, err)
		events = append(events, e)
	}
	turns := map[string]map[string]envelope.Event{} // prompt -> turn event ID -> event
	for _, e := range events {
		if isTurn(e) {
			for _, id := range e.MessageIDs {
				if turns[id] == nil {
					turns[id] = map[string]envelope.Event{}
				}
				turns[id][e.ID] = e
			}
		}
	}
	conflictRejects := map[string]int{}
	rejects := testkit.ReadAll(t, c.brokerAddr, "prompts.rejects")
	for _, m := range rejects {
		var reason string
		for _, h := range m.Headers {
			if string(h.Key) == "reason" {
				reason = string(h.Value)
			}
		}
		var p envelope.Prompt
		if reason == envelope.ReasonConflict && json.Unmarshal(m.Value, &p) == nil {
			conflictRejects[p.MessageID]++
		}
	}

	ctx := context.Background()
	admitted := map[string]string{} // message ID -> text
	rs, err := b.pool.Query(ctx, `SELECT message_id, text FROM inputs WHERE session_id LIKE 'sw-%'`)
	require.NoError(t, err)
	for rs.Next() {
		var id, text string
		require.NoError(t, rs.Scan(&id, &text))
		admitted[id] = text
	}
	require.NoError(t, rs.Err())

	var lost, twice []string
	outcomes := map[string]int{}
	nAdmitted := 0
	for _, p := range c.r.prompts {
		if _, ok := admitted[p.MessageID]; ok {
			nAdmitted++
		}
		ts := turns[p.MessageID]
		switch {
		case len(ts) == 0:
			lost = append(lost, p.MessageID+" ("+p.SessionID+")")
		case len(ts) > 1:
			twice = append(twice, p.MessageID)
		}
		for _, e := range ts {
			outcomes[cmp.Or(e.Reason, "completed")]++
			break
		}
	}
	var finalTwice int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT a FROM messages m, unnest(m.answers) a
		WHERE m.role = 'assistant' AND (m.status = 'errored' OR (m.status = 'completed'
			AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message_id = m.message_id AND p.kind = 'tool_call')))
		GROUP BY a HAVING count(*) > 1) x`).Scan(&finalTwice))
	if finalTwice > 0 {
		twice = append(twice, fmt.Sprintf("%d prompts with more than one final assistant message", finalTwice))
	}
	var conflictBad []string
	for id, text := range c.conflicts {
		if admitted[id] != text {
			conflictBad = append(conflictBad, id+": the conflicting reuse changed the input")
		}
		if conflictRejects[id] == 0 {
			conflictBad = append(conflictBad, id+": no conflict reject")
		}
	}
	var decisions []string
	rs, err = b.pool.Query(ctx, `SELECT decision || coalesce('/' || rule, ''), count(*) FROM recoveries GROUP BY 1 ORDER BY 1`)
	require.NoError(t, err)
	nRecoveries, nReconciled := 0, 0
	for rs.Next() {
		var d string
		var n int
		require.NoError(t, rs.Scan(&d, &n))
		decisions = append(decisions, fmt.Sprintf("%s %d", d, n))
		nRecoveries += n
		if strings.HasPrefix(d, "reconciled") {
			nReconciled += n
		}
	}
	require.NoError(t, rs.Err())
	var zombie int
	require.NoError(t, b.pool.QueryRow(ctx, zombieWritesSQL).Scan(&zombie))
	quarantined := b.count(t, `SELECT (SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL)
		+ (SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL)
		+ (SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL)
		+ (SELECT count(*) FROM recoveries WHERE quarantine_reason IS NOT NULL)`)
	// Events name only messages and inputs that exist.
	var dangling []string
	for _, e := range events {
		if e.AssistantMessageID != "" && b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1`, e.AssistantMessageID) == 0 {
			dangling = append(dangling, fmt.Sprintf("%s %s names assistant message %s", e.Type, e.ID, e.AssistantMessageID))
		}
	}
	side := sideEffectViolations(t, c.r.sandbox, c.r.tools)
	var state []string
	for _, v := range stateViolations(t, b) {
		if !strings.Contains(v, "quarantined") { // counted on their own row
			state = append(state, v)
		}
	}

	kinds := map[string]int{}
	hit, claimsHit := 0, 0
	for _, f := range c.faults {
		kinds[f.kind]++
		if f.inFlight > 0 {
			hit++
			claimsHit += f.inFlight
		}
	}
	var kindList []string
	for k, n := range kinds {
		kindList = append(kindList, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kindList)
	var outcomeList []string
	for k, n := range outcomes {
		outcomeList = append(outcomeList, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(outcomeList)
	st := c.proxy.Stats()

	row("prompts sent (distinct, each must end in one turn)", len(c.r.prompts))
	row("records sent (prompts, duplicates, conflicts, retries, replies)", c.sends)
	row("exact duplicates sent", c.duplicates)
	row("conflicting reuses sent", len(c.conflicts))
	row("admitted", nAdmitted)
	row("turns by outcome", strings.Join(outcomeList, ", "))
	row("completed", outcomes["completed"])
	row("failed", len(c.r.prompts)-len(lost)-outcomes["completed"])
	row("uncertain reconciled (recoveries)", nReconciled)
	row("rejects (all reasons)", len(rejects))
	must0("lost", len(lost), lost)
	must0("answered twice", len(twice), twice)
	must0("side effects repeated", len(side), side)
	must0("zombie writes accepted", zombie, nil)
	must0("valid rows quarantined", quarantined, nil)
	must0("conflicting reuses not rejected or not harmless", len(conflictBad), conflictBad)
	must0("events naming a message that does not exist", len(dangling), dangling)
	must0("other invariant violations", len(state), state)
	row("faults injected", fmt.Sprintf("%d (%s)", len(c.faults), strings.Join(kindList, ", ")))
	row("faults that hit turns in flight", hit)
	row("turns in flight when a fault hit (claims, summed)", claimsHit)
	row("recoveries decided", fmt.Sprintf("%d (%s)", nRecoveries, strings.Join(decisions, ", ")))
	row("proxy", fmt.Sprintf("%d connections, %d cut, %d stalls held", st.Accepted, st.Cut, st.Stalls))
	row("consumer restarts after SIGKILL", c.restarts)
	row("exits the soak did not cause", fmt.Sprintf("%d %s", len(c.unexpected), strings.Join(c.unexpected, "; ")))
	if hit == 0 {
		failures = append(failures, "no fault hit a turn in flight: the soak tested nothing")
	}
	if nAdmitted != len(c.r.prompts) {
		failures = append(failures, fmt.Sprintf("%d of %d prompts admitted", nAdmitted, len(c.r.prompts)))
	}

	var out strings.Builder
	out.WriteString("| figure | value |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&out, "| %s | %s |\n", r[0], r[1])
	}
	return out.String(), failures
}

// TestChaosZombieCheck shows that the soak's zombie-write figure can fail:
// rows of a recovered execution under its old token, inserted or finished
// after the takeover, are counted; the execution's rows from before it,
// recovery's own marks, the next execution's rows and a call of E
// dispatched by the execution that took the turn on are not.
func TestChaosZombieCheck(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, zombieWritesSQL).Scan(&n))
		return n
	}
	exec(`INSERT INTO sessions (session_id, fencing_token) VALUES ('s', 2)`)
	for _, rule := range []string{"", "idempotent_tool_retry"} {
		e := "e-" + cmp.Or(rule, "plain")
		exec(`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, rule, evidence, token_before, token_after,
			recovered_by, decided_at) VALUES ($1, 's', 'unknown', 'reconciled', nullif($2, ''), '{}', 1, 2, 'r', '2026-01-01 00:00:10Z')`, e, rule)
		exec(`INSERT INTO messages (message_id, session_id, role, status, execution_id, fencing_token, created_at, completed_at)
			VALUES ($1 || '-before', 's', 'assistant', 'completed', $1, 1, '2026-01-01 00:00:05Z', '2026-01-01 00:00:06Z'),
			       ($1 || '-marked', 's', 'assistant', 'errored', $1, 1, '2026-01-01 00:00:05Z', '2026-01-01 00:00:10Z'),
			       ($1 || '-next', 's', 'assistant', 'completed', 'e-next', 2, '2026-01-01 00:00:11Z', '2026-01-01 00:00:12Z')`, e)
		exec(`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider, idempotency_key,
			fencing_token, request_hash, state, started_at, finished_at)
			VALUES ($1 || '-a', 's', $1, $1 || '-before', 0, 'p', 'k', 1, '\x00', 'succeeded', '2026-01-01 00:00:05Z', '2026-01-01 00:00:06Z')`, e)
		exec(`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class, input,
			idempotency_key, fencing_token, state, requested_at, started_at, finished_at)
			VALUES ($1 || '-idem', $1 || '-a', 's', $1, 0, 'c', 'echo', 'idempotent', '{}', 'k', 1, 'succeeded',
			        '2026-01-01 00:00:05Z', '2026-01-01 00:00:11Z', '2026-01-01 00:00:12Z')`, e)
	}
	require.Zero(t, count(), "rows from before the takeover, recovery's marks, the next execution's rows, a call dispatched by it")

	exec(`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class, input,
		idempotency_key, fencing_token, state, requested_at)
		VALUES ('zombie-call', 'e-plain-a', 's', 'e-plain', 1, 'c', 'echo', 'idempotent', '{}', 'k2', 1, 'requested',
		        '2026-01-01 00:00:11Z')`)
	require.Equal(t, 1, count(), "a call requested under the old token after the takeover")

	exec(`INSERT INTO messages (message_id, session_id, role, status, execution_id, fencing_token, created_at)
		VALUES ('zombie-insert', 's', 'assistant', 'pending', 'e-plain', 1, '2026-01-01 00:00:11Z')`)
	require.Equal(t, 2, count(), "a message inserted under the old token after the takeover")
	exec(`UPDATE attempts SET finished_at = '2026-01-01 00:00:11Z' WHERE attempt_id = 'e-idempotent_tool_retry-a'`)
	require.Equal(t, 3, count(), "an attempt finished under the old token after the takeover")
	exec(`UPDATE messages SET completed_at = '2026-01-01 00:00:11Z' WHERE message_id = 'e-plain-before'`)
	require.Equal(t, 4, count(), "a message completed under the old token after the takeover")
}
