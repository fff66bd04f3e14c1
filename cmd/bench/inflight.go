package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// Goals of issue 21 for ten thousand turns in flight.
const (
	goalInFlightRSSBytes       = 200 << 20 // consumer peak RSS (VmHWM)
	goalInFlightOverheadP99    = 250       // ms past the provider's sleep
	goalBurstLastStartSeconds  = 3.0       // from the first produce to the last attempt started
	inFlightConsumerAppName    = "promptline-bench-inflight"
	inFlightSampleEvery        = 200 * time.Millisecond
	inFlightConsumerStartLimit = 3 * time.Minute
)

// inFlightOpts configure the in-flight measurement.
type inFlightOpts struct {
	// Rate of the steady phase, prompts per second, each its own session.
	Rate float64
	// Duration of the steady phase's offered load.
	Duration time.Duration
	// Sleep is how long the scripted provider takes per turn (/sleep).
	Sleep time.Duration
	// ToolTurns makes each turn a turn with a tool call: its first step
	// asks for the echo tool at once, its second waits Sleep
	// (/sleep-after-tools), as an agent's turn waits on its model again
	// after its tools.
	ToolTurns bool
	// Burst is how many prompts the burst phase produces at once; 0
	// skips it.
	Burst int
	// MaxSessions is the consumer's --max-sessions.
	MaxSessions int
	// PoolSize is the consumer's --db-max-conns.
	PoolSize int32
	// Partitions of every topic.
	Partitions int32
	// Kafka gives each phase fresh topics.
	Kafka kafkaBackend
}

// inFlightPeaks are the consumer's peaks over a phase, sampled every
// inFlightSampleEvery (RSS is the kernel's own high-water mark).
type inFlightPeaks struct {
	// RSSBytes is VmHWM from /proc/PID/status at the end of the phase:
	// the process's peak resident set since it started.
	RSSBytes int64 `json:"peak_rss_bytes"`
	// Goroutines is the largest go_goroutines the consumer's /metrics
	// served.
	Goroutines int `json:"peak_goroutines"`
	// Executions is the largest promptline_active_executions served.
	Executions int `json:"peak_active_executions"`
	// StackBytes and HeapBytes are the largest go_memstats_stack_inuse_bytes
	// and go_memstats_heap_inuse_bytes served: where the RSS is, goroutine
	// stacks against the heap (docs/benchmarks.md, "A few bytes of a
	// frame": a parked execution keeps an 8 KiB stack, 16 KiB once one
	// call of its turn passes 8 KiB).
	StackBytes int64 `json:"peak_stack_inuse_bytes"`
	HeapBytes  int64 `json:"peak_heap_inuse_bytes"`
	// Connections are the consumer's client backends in pg_stat_activity
	// (its pool's open connections); Busy those not idle (running a
	// statement or inside a transaction). The parallel workers of its
	// statements carry its application_name too, and are not connections:
	// they come from max_worker_processes, not from the pool or
	// max_connections.
	Connections int `json:"peak_connections"`
	Busy        int `json:"peak_busy_connections"`
	// InFlight is the largest count of prompts sent and not yet answered.
	InFlight int `json:"peak_in_flight"`
	// Renewals is the last promptline_claims_total{event="renewed"}
	// served: the leases renewed by a transaction of their own (a write
	// renews its lease too, uncounted).
	Renewals int64 `json:"renewals"`
	Samples  int   `json:"samples"`
	// OverPool lists the consumer's backends (state, wait event, age,
	// query) at the first sample that saw more of them than its pool
	// holds: the evidence for where the extra ones come from.
	OverPool []string `json:"over_pool,omitempty"`
}

// inFlightSteady is the steady phase: prompts at a fixed rate.
type inFlightSteady struct {
	Sent      int `json:"sent"`
	Measured  int `json:"measured"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Missing   int `json:"missing"`
	// Overhead is send → turn.completed seen, minus the provider's sleep.
	Overhead     percentiles   `json:"overhead"`
	AchievedRate float64       `json:"achieved_per_second"`
	Peaks        inFlightPeaks `json:"peaks"`
	CPU          cpuUse        `json:"cpu"`
	// Stages split send → answer published into legs, from the stored
	// timestamps (stages.go); the provider's sleep is inside the third.
	Stages []stage `json:"stages"`
}

// inFlightBurst is the burst phase: prompts produced at once.
type inFlightBurst struct {
	Prompts int `json:"prompts"`
	// ProduceSeconds is how long producing them took.
	ProduceSeconds float64 `json:"produce_seconds"`
	// LastStartSeconds is from just before the first produce (the
	// server's clock) to the newest provider attempt's started_at.
	LastStartSeconds  float64 `json:"last_start_seconds"`
	FirstStartSeconds float64 `json:"first_start_seconds"`
	Attempts          int64   `json:"attempts"`
	// StartsPerSecond is the attempts over the span from the first start
	// to the last: how fast this machine starts turns right now, the
	// same-run baseline for the steady phase's offered rate.
	StartsPerSecond  float64       `json:"starts_per_second"`
	CompletedSeconds float64       `json:"completed_seconds"`
	Peaks            inFlightPeaks `json:"peaks"`
}

// inFlightResult is both phases, with the settings they ran at.
type inFlightResult struct {
	Kafka       string         `json:"kafka"`
	Rate        float64        `json:"rate"`
	Seconds     float64        `json:"duration_seconds"`
	Sleep       float64        `json:"sleep_seconds"`
	ToolTurns   bool           `json:"tool_turns,omitempty"`
	MaxSessions int            `json:"max_sessions"`
	PoolSize    int32          `json:"pool_size"`
	Partitions  int32          `json:"partitions"`
	Steady      inFlightSteady `json:"steady"`
	Burst       *inFlightBurst `json:"burst,omitempty"`
	// Machine is as the main report's.
	Machine map[string]string `json:"machine,omitempty"`
}

// inFlightOptions are the flags of `bench inflight`.
type inFlightOptions struct {
	databaseURL string
	inFlightOpts
	kafka string
	json  bool
}

func newInFlightCommand() *cobra.Command {
	o := &inFlightOptions{}
	cmd := &cobra.Command{
		Use:   "inflight",
		Short: "Ten thousand turns in flight: one consumer process, prompts at a rate, each its own session and a slow provider; then a burst",
		Long: `Offers --rate prompts per second for --duration, each its own session, each
asking the scripted provider to take --sleep, to one consumer process
(--max-sessions, --db-max-conns) on a broker outside it; reports the
consumer's peak RSS (VmHWM), goroutines and executions (its /metrics), its
Postgres connections (pg_stat_activity) and the overhead past the sleep
(send → turn.completed seen, minus --sleep), p50/p99. Then --burst such
prompts produced at once: time from the first produce to the last provider
attempt started (attempts.started_at). See docs/benchmarks.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case o.Rate <= 0 || o.Duration <= 0 || o.Sleep < 0:
				return errors.New("--rate and --duration must be positive, --sleep not negative")
			case o.Burst < 0 || o.MaxSessions < 1 || o.PoolSize < 2 || o.Partitions < 1:
				return errors.New("--burst must not be negative, --max-sessions and --partitions at least 1, --db-max-conns at least 2")
			case o.kafka != kafkaApache && o.kafka != kafkaEmbedded:
				return fmt.Errorf("--kafka must be apache or embedded, got %q", o.kafka)
			}
			return runInFlight(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"Postgres server URL (env DATABASE_URL; default postgres://127.0.0.1:5432/postgres, else a throwaway cluster); scratch databases are created there and dropped")
	f.Float64Var(&o.Rate, "rate", 1000, "prompts per second of the steady phase, each its own session")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "length of the steady phase's offered load (the first tenth, at most 2s, is not measured)")
	f.DurationVar(&o.Sleep, "sleep", 10*time.Second, "how long the scripted provider takes per turn (/sleep)")
	f.BoolVar(&o.ToolTurns, "tool-turns", false, "make each turn a turn with a tool call: its first step asks for the echo tool at once, its second takes --sleep (/sleep-after-tools)")
	f.IntVar(&o.Burst, "burst", 10000, "prompts of the burst phase, produced at once; 0 skips it")
	f.IntVar(&o.MaxSessions, "max-sessions", 10000, "the consumer's --max-sessions")
	f.Int32Var(&o.PoolSize, "db-max-conns", 32, "the consumer's --db-max-conns (its pool size; 32 is its default)")
	f.Int32Var(&o.Partitions, "partitions", 16, "partitions of every topic")
	f.StringVar(&o.kafka, "kafka", kafkaApache, "broker: apache (a single-node Apache Kafka started with scripts/kafka.sh, a process of its own) or embedded (in the bench process, not the consumer's)")
	f.BoolVar(&o.json, "json", false, "print the results as JSON")
	return cmd
}

func runInFlight(ctx context.Context, o *inFlightOptions, stdout, stderr io.Writer) (err error) {
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	sc, err := newScratchServer(ctx, o.databaseURL, progress)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sc.close(ctx)) }()
	o.Kafka = embeddedKafka{}
	if o.kafka == kafkaApache {
		ak, err := startApacheKafka(progress)
		if err != nil {
			return err
		}
		defer ak.stop()
		o.Kafka = ak
	}
	facts, err := sc.serverFacts(ctx)
	if err != nil {
		return err
	}
	r, err := measureInFlight(ctx, sc, o.inFlightOpts, progress)
	if err != nil {
		return err
	}
	r.Machine = machineFacts(facts)
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(&r)
	}
	printMachine(stdout, &report{Machine: r.Machine})
	printInFlight(stdout, &r)
	return nil
}

// measureInFlight builds the consumer and runs the steady phase, then the
// burst, each on fresh topics and a fresh database.
func measureInFlight(ctx context.Context, sc *scratchServer, o inFlightOpts, progress func(string, ...any)) (res inFlightResult, err error) {
	res = inFlightResult{Kafka: o.Kafka.name(), Rate: o.Rate, Seconds: o.Duration.Seconds(), Sleep: o.Sleep.Seconds(), ToolTurns: o.ToolTurns,
		MaxSessions: o.MaxSessions, PoolSize: o.PoolSize, Partitions: o.Partitions}
	bin, cleanup, err := buildConsumer(ctx, progress)
	if err != nil {
		return res, err
	}
	defer cleanup()
	progress("in flight: %.0f prompts/s for %s, each its own session, %q, --max-sessions %d, one consumer process on %s Kafka",
		o.Rate, o.Duration, o.promptText(), o.MaxSessions, o.Kafka.name())
	if res.Steady, err = inFlightSteadyOnce(ctx, sc, bin, o); err != nil {
		return res, fmt.Errorf("in flight, steady: %w", err)
	}
	if o.Burst > 0 {
		progress("in flight: a burst of %d such prompts produced at once", o.Burst)
		b, err := inFlightBurstOnce(ctx, sc, bin, o)
		if err != nil {
			return res, fmt.Errorf("in flight, burst: %w", err)
		}
		res.Burst = &b
	}
	return res, nil
}

// inFlightConsumer is a consumer process of the in-flight measurement on
// a fresh database and fresh topics, its group settled.
type inFlightConsumer struct {
	proc    *benchProc
	db      *scratchDB
	brokers []string
	metrics string // host:port of its /metrics
	release func()
}

func startInFlightConsumer(ctx context.Context, sc *scratchServer, bin string, o inFlightOpts) (c *inFlightConsumer, err error) {
	brokers, release, err := o.Kafka.fresh(o.Partitions)
	if err != nil {
		return nil, err
	}
	c = &inFlightConsumer{brokers: brokers, release: release}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.stop(ctx))
			c = nil
		}
	}()
	if c.db, err = sc.create(ctx, poolOpts{MaxConns: 2}); err != nil {
		return c, err
	}
	u, err := url.Parse(sc.dbURL(c.db.Name))
	if err != nil {
		return c, err
	}
	q := u.Query()
	q.Set("application_name", inFlightConsumerAppName)
	u.RawQuery = q.Encode()
	c.proc, err = startBenchProc(ctx, bin, "consumer", "--brokers", strings.Join(brokers, ","), "--database-url", u.String(),
		"--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(o.Partitions), "--group", "bench-inflight-"+c.db.Name,
		"--max-sessions", fmt.Sprint(o.MaxSessions), "--db-max-conns", fmt.Sprint(o.PoolSize), "--log-level", "info")
	if err != nil {
		return c, err
	}
	line, err := waitProcLog(ctx, c.proc, "consumer running", inFlightConsumerStartLimit)
	if err != nil {
		return c, err
	}
	c.metrics, _ = line["metrics_addr"].(string)
	if c.metrics == "" {
		return c, errors.New("the consumer logged no metrics_addr")
	}
	return c, waitStableGroup(ctx, []*benchProc{c.proc}, inFlightConsumerStartLimit)
}

func (c *inFlightConsumer) stop(ctx context.Context) error {
	var err error
	if c.proc != nil {
		err = c.proc.stop()
	}
	if c.db != nil {
		err = errors.Join(err, c.db.drop(ctx))
	}
	c.release()
	return err
}

// waitProcLog waits for the first JSON log line of p whose msg is msg.
func waitProcLog(ctx context.Context, p *benchProc, msg string, timeout time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(timeout)
	for {
		for l := range strings.Lines(p.logs()) {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
				return line, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%s exited (%s):\n%s", p.name, p.cmd.ProcessState, tail(p.logs(), 20))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not log %q within %s", p.name, msg, timeout)
		}
	}
}

// sampler polls the consumer's figures until stopped and keeps the peaks.
type sampler struct {
	c        *inFlightConsumer
	inFlight func() int
	pool     int
	stopCh   chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	peaks    inFlightPeaks
	err      error
}

func startSampler(ctx context.Context, c *inFlightConsumer, poolSize int32, inFlight func() int) *sampler {
	s := &sampler{c: c, inFlight: inFlight, pool: int(poolSize), stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(inFlightSampleEvery)
		defer tick.Stop()
		for {
			s.sample(ctx)
			select {
			case <-tick.C:
			case <-s.stopCh:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return s
}

func (s *sampler) sample(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	g, mErr := scrapeGauges(sctx, s.c.metrics)
	var conns, busy int
	cErr := s.c.db.Pool.QueryRow(sctx, `
SELECT count(*), count(*) FILTER (WHERE state IS DISTINCT FROM 'idle')
FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND backend_type = 'client backend'`,
		inFlightConsumerAppName).Scan(&conns, &busy)
	var over []string
	if cErr == nil && conns > s.pool {
		over = s.backends(sctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &s.peaks
	p.Samples++
	if over != nil && p.OverPool == nil {
		p.OverPool = over
	}
	p.Goroutines, p.Executions = max(p.Goroutines, g.goroutines), max(p.Executions, g.executions)
	p.StackBytes, p.HeapBytes = max(p.StackBytes, g.stack), max(p.HeapBytes, g.heap)
	p.Connections, p.Busy = max(p.Connections, conns), max(p.Busy, busy)
	p.Renewals = max(p.Renewals, g.renewals)
	if s.inFlight != nil {
		p.InFlight = max(p.InFlight, s.inFlight())
	}
	// One failed sample on a loaded machine is not a failed run; a run
	// without a single good one is.
	if mErr != nil || cErr != nil {
		s.err = errors.Join(mErr, cErr)
	}
}

// backends describes the consumer's backends, oldest first.
func (s *sampler) backends(ctx context.Context) []string {
	rows, err := s.c.db.Pool.Query(ctx, `
SELECT format('%s %s/%s, connected %s ago, in state %s ago: %s', state, wait_event_type, wait_event,
              date_trunc('milliseconds', now() - backend_start), date_trunc('milliseconds', now() - state_change),
              left(regexp_replace(query, '\s+', ' ', 'g'), 80))
FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND backend_type = 'client backend'
ORDER BY backend_start`, inFlightConsumerAppName)
	if err != nil {
		return []string{"reading pg_stat_activity: " + err.Error()}
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return []string{"reading pg_stat_activity: " + err.Error()}
	}
	return out
}

// stop ends the sampling and returns the peaks with the consumer's VmHWM.
func (s *sampler) stop() (inFlightPeaks, error) {
	close(s.stopCh)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	hwm, err := procStatusBytes(s.c.proc.cmd.Process.Pid, "VmHWM")
	if err != nil {
		return s.peaks, err
	}
	s.peaks.RSSBytes = hwm
	if s.peaks.Goroutines == 0 || s.peaks.Connections == 0 {
		return s.peaks, fmt.Errorf("no sample of the consumer's metrics and connections succeeded: %w", s.err)
	}
	return s.peaks, nil
}

// gauges are the figures a sample reads from the consumer's /metrics.
type gauges struct {
	goroutines, executions int
	stack, heap, renewals  int64
}

// scrapeGauges reads go_goroutines, promptline_active_executions,
// go_memstats_stack_inuse_bytes, go_memstats_heap_inuse_bytes and
// promptline_claims_total{event="renewed"} from a /metrics endpoint.
func scrapeGauges(ctx context.Context, addr string) (gauges, error) {
	var g gauges
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return g, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return g, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return g, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	fields := map[string]func(float64){
		"go_goroutines":                            func(v float64) { g.goroutines = int(v) },
		"promptline_active_executions":             func(v float64) { g.executions = int(v) },
		"go_memstats_stack_inuse_bytes":            func(v float64) { g.stack = int64(v) },
		"go_memstats_heap_inuse_bytes":             func(v float64) { g.heap = int64(v) },
		`promptline_claims_total{event="renewed"}`: func(v float64) { g.renewals = int64(v) },
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seen := 0
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if set, ok := fields[name]; ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return g, fmt.Errorf("%s: %w", name, err)
			}
			set(v)
			seen++
		}
	}
	if err := sc.Err(); err != nil {
		return g, err
	}
	if seen != len(fields) {
		return g, fmt.Errorf("/metrics serves %d of the %d series a sample reads (go_goroutines, promptline_active_executions, go_memstats_stack_inuse_bytes, go_memstats_heap_inuse_bytes, promptline_claims_total{event=\"renewed\"})", seen, len(fields))
	}
	return g, nil
}

// procStatusBytes reads a "kB" field of /proc/PID/status, in bytes.
func procStatusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/%d/status: %s: %q", pid, field, rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		return kb << 10, err
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// promptText is the text of every prompt: the scripted provider's
// directives.
func (o *inFlightOpts) promptText() string {
	if o.ToolTurns {
		return `/tool echo {"text": "x"}` + "\n/sleep-after-tools " + o.Sleep.String()
	}
	return "/sleep " + o.Sleep.String()
}

func inFlightSteadyOnce(ctx context.Context, sc *scratchServer, bin string, o inFlightOpts) (res inFlightSteady, err error) {
	c, err := startInFlightConsumer(ctx, sc, bin, o)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.stop(ctx)) }()
	tr := newTracker()
	events, err := readEvents(c.brokers, tr)
	if err != nil {
		return res, err
	}
	defer events.close()

	s := startSampler(ctx, c, o.PoolSize, tr.outstanding)
	c0 := sampleCPU()
	sent, sendSecs, err := offer(ctx, c.brokers, tr, latencyOpts{
		Rate: o.Rate, Duration: o.Duration, Warmup: warmupFor(o.Duration), Text: o.promptText(),
	})
	if err != nil {
		_, _ = s.stop()
		return res, err
	}
	deadline := tr.waitAll(ctx, o.Sleep+30*time.Second)
	c1 := sampleCPU()
	peaks, err := s.stop()
	if err != nil {
		return res, err
	}
	lat := tr.results(deadline)
	st, err := stages(ctx, c.db.Pool, lat.ids, lat.sentAt)
	if err != nil {
		return res, err
	}
	over := make([]time.Duration, len(lat.turn))
	for i, d := range lat.turn {
		over[i] = d - o.Sleep
	}
	return inFlightSteady{
		Sent: sent, Measured: lat.measured, Completed: lat.completed, Failed: lat.failed,
		Missing:  lat.measured - lat.completed - lat.failed,
		Overhead: percentilesOf(over), AchievedRate: float64(sent) / sendSecs, Peaks: peaks, CPU: cpuBetween(c0, c1),
		Stages: st,
	}, nil
}

func inFlightBurstOnce(ctx context.Context, sc *scratchServer, bin string, o inFlightOpts) (res inFlightBurst, err error) {
	w, err := newWorkloadText(o.Burst, 1, o.promptText())
	if err != nil {
		return res, err
	}
	c, err := startInFlightConsumer(ctx, sc, bin, o)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.stop(ctx)) }()
	answered, stopReader, err := countTurns(c.brokers[0], w, nil)
	if err != nil {
		return res, err
	}
	defer stopReader()

	s := startSampler(ctx, c, o.PoolSize, nil)
	// The server's clock, as attempts.started_at is: no skew between the
	// two ends of the figure.
	var t0 time.Time
	if err := c.db.Pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t0); err != nil {
		_, _ = s.stop()
		return res, err
	}
	start := time.Now()
	if err := prefill(ctx, c.brokers, "prompts", w); err != nil {
		_, _ = s.stop()
		return res, err
	}
	res.ProduceSeconds = time.Since(start).Seconds()
	select {
	case <-answered:
	case <-c.proc.exited:
		_, _ = s.stop()
		return res, fmt.Errorf("the consumer exited (%s):\n%s", c.proc.cmd.ProcessState, tail(c.proc.logs(), 20))
	case <-ctx.Done():
		_, _ = s.stop()
		return res, ctx.Err()
	case <-time.After(o.Sleep + 5*time.Minute):
		_, _ = s.stop()
		return res, fmt.Errorf("not every prompt of the burst was answered within %s", o.Sleep+5*time.Minute)
	}
	res.CompletedSeconds = time.Since(start).Seconds()
	if res.Peaks, err = s.stop(); err != nil {
		return res, err
	}
	var first, last time.Time
	if err := c.db.Pool.QueryRow(ctx, "SELECT count(*), min(started_at), max(started_at) FROM attempts").Scan(&res.Attempts, &first, &last); err != nil {
		return res, fmt.Errorf("reading the attempts' start times: %w", err)
	}
	res.Prompts = o.Burst
	res.FirstStartSeconds, res.LastStartSeconds = first.Sub(t0).Seconds(), last.Sub(t0).Seconds()
	if span := last.Sub(first).Seconds(); span > 0 {
		res.StartsPerSecond = float64(res.Attempts) / span
	}
	return res, nil
}

// printInFlight prints the figures with the goals beside them.
func printInFlight(out io.Writer, r *inFlightResult) {
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	s := r.Steady
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	sleep := "/sleep"
	if r.ToolTurns {
		sleep = "a tool, then /sleep-after-tools"
	}
	fmt.Fprintf(tw, "in-flight figure (%.0f/s for %.0fs, %s %gs, --max-sessions %d, %s Kafka)\tvalue\tgoal\tmet?\t\n",
		r.Rate, r.Seconds, sleep, r.Sleep, r.MaxSessions, r.Kafka)
	fmt.Fprintf(tw, "turns in flight, peak (sent, not answered)\t%d\t\t\t\n", s.Peaks.InFlight)
	fmt.Fprintf(tw, "consumer's active executions, peak\t%d\t\t\t\n", s.Peaks.Executions)
	fmt.Fprintf(tw, "consumer peak RSS, VmHWM (MiB)\t%.0f\t< %d\t%s\t\n", mib(s.Peaks.RSSBytes), goalInFlightRSSBytes>>20, met(s.Peaks.RSSBytes < goalInFlightRSSBytes))
	fmt.Fprintf(tw, "consumer goroutines, peak\t%d\t\t\t\n", s.Peaks.Goroutines)
	fmt.Fprintf(tw, "  their stacks in use, peak (MiB)\t%.0f\t\t\t\n", mib(s.Peaks.StackBytes))
	if s.Peaks.Executions > 0 {
		fmt.Fprintf(tw, "  stack per active execution, at the peaks (KiB)\t%.1f\t\t\t\n", float64(s.Peaks.StackBytes)/float64(s.Peaks.Executions)/1024)
	}
	fmt.Fprintf(tw, "consumer heap in use, peak (MiB)\t%.0f\t\t\t\n", mib(s.Peaks.HeapBytes))
	fmt.Fprintf(tw, "consumer's Postgres connections, peak\t%d\t≤ %d (pool)\t%s\t\n", s.Peaks.Connections, r.PoolSize, met(s.Peaks.Connections <= int(r.PoolSize)))
	fmt.Fprintf(tw, "  of them busy (not idle), peak\t%d\t\t\t\n", s.Peaks.Busy)
	fmt.Fprintf(tw, "leases renewed (transactions of their own)\t%d\t\t\t\n", s.Peaks.Renewals)
	fmt.Fprintf(tw, "overhead p50 (ms past the sleep)\t%.1f\t\t\t\n", s.Overhead.P50)
	fmt.Fprintf(tw, "overhead p99 (ms past the sleep)\t%.1f\t< %d\t%s\t\n", s.Overhead.P99, goalInFlightOverheadP99,
		met(s.Overhead.P99 < goalInFlightOverheadP99 && s.Missing == 0 && s.Failed == 0))
	if b := r.Burst; b != nil {
		fmt.Fprintf(tw, "burst of %d: last turn started after (s)\t%.2f\t≤ %.0f\t%s\t\n", b.Prompts, b.LastStartSeconds, goalBurstLastStartSeconds,
			met(b.LastStartSeconds <= goalBurstLastStartSeconds && b.Attempts == int64(b.Prompts)))
		if b.StartsPerSecond > 0 {
			fmt.Fprintf(tw, "burst: turns started per second (this machine, now)\t%.0f\t\t\t\n", b.StartsPerSecond)
			fmt.Fprintf(tw, "steady rate / burst start rate (> 1: the steady phase queues)\t%.2f\t< 1\t%s\t\n", r.Rate/b.StartsPerSecond, met(r.Rate < b.StartsPerSecond))
		}
		fmt.Fprintf(tw, "burst: consumer peak RSS (MiB)\t%.0f\t< %d\t%s\t\n", mib(b.Peaks.RSSBytes), goalInFlightRSSBytes>>20, met(b.Peaks.RSSBytes < goalInFlightRSSBytes))
		fmt.Fprintf(tw, "burst: stacks, heap in use, peaks (MiB)\t%.0f, %.0f\t\t\t\n", mib(b.Peaks.StackBytes), mib(b.Peaks.HeapBytes))
		fmt.Fprintf(tw, "burst: Postgres connections, peak\t%d\t≤ %d (pool)\t%s\t\n", b.Peaks.Connections, r.PoolSize, met(b.Peaks.Connections <= int(r.PoolSize)))
	}
	tw.Flush()
	fmt.Fprintf(out, "steady: %d sent (%.0f/s achieved), %d measured after warm-up, %d completed, %d failed, %d unanswered after the drain (counted with their age then); overhead p50 %.1f, p90 %.1f, p99 %.1f, max %.1f ms; %d samples; CPU %.2f cores busy (bench %.2f)\n",
		s.Sent, s.AchievedRate, s.Measured, s.Completed, s.Failed, s.Missing, s.Overhead.P50, s.Overhead.P90, s.Overhead.P99, s.Overhead.Max, s.Peaks.Samples, s.CPU.Machine, s.CPU.Bench)
	for _, st := range s.Stages {
		fmt.Fprintf(out, "steady stage %-52s p50 %8.1f  p99 %8.1f ms\n", st.Name, st.P50, st.P99)
	}
	for _, ph := range []struct {
		name  string
		peaks inFlightPeaks
	}{{"steady", s.Peaks}, {"burst", burstPeaks(r.Burst)}} {
		if len(ph.peaks.OverPool) > 0 {
			fmt.Fprintf(out, "%s: more backends than the pool's %d at one sample:\n", ph.name, r.PoolSize)
			for _, b := range ph.peaks.OverPool {
				fmt.Fprintf(out, "  %s\n", b)
			}
		}
	}
	if b := r.Burst; b != nil {
		fmt.Fprintf(out, "burst: %d prompts produced in %.2fs; %d provider attempts, the first started %.2fs and the last %.2fs after the first produce; all answered after %.2fs; peaks: %d goroutines, %d executions, %d connections (%d busy)\n",
			b.Prompts, b.ProduceSeconds, b.Attempts, b.FirstStartSeconds, b.LastStartSeconds, b.CompletedSeconds, b.Peaks.Goroutines, b.Peaks.Executions, b.Peaks.Connections, b.Peaks.Busy)
	}
}

func burstPeaks(b *inFlightBurst) inFlightPeaks {
	if b == nil {
		return inFlightPeaks{}
	}
	return b.Peaks
}
