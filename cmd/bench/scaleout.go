package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// scaleOutMaxConns is --db-max-conns of every consumer process in the
// scale-out runs: three processes at the default 32 would take almost all
// of a default server's 100 connections.
const scaleOutMaxConns = 16

// scaleOutRun is admission + execution throughput with some consumer
// processes in one group.
type scaleOutRun struct {
	Processes int     `json:"processes"`
	Prompts   int     `json:"prompts"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"prompts_per_second"`
	CPU       cpuUse  `json:"cpu"`
}

// scaleOutResult compares three consumer processes with one.
type scaleOutResult struct {
	One   scaleOutRun `json:"one"`
	Three scaleOutRun `json:"three"`
	Ratio float64     `json:"three_to_one"`
}

// measureScaleOut builds the consumer binary once and measures one, then
// three, consumer processes, each run against a fresh broker and a fresh
// scratch database: n prompts over n/10 sessions, produced in one go once
// the group is stable, timed from the first produced prompt to the last
// turn event read back. Processes, not goroutines: that is what a
// deployment runs, with its own pools, relays and recovery loops.
func measureScaleOut(ctx context.Context, sc *scratchServer, n int, partitions int32, progress func(string, ...any)) (res scaleOutResult, err error) {
	dir, err := os.MkdirTemp("", "promptline-bench-consumer-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "consumer")
	progress("scale-out: building the consumer")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/promptline/promptline/cmd/consumer").CombinedOutput(); err != nil {
		return res, fmt.Errorf("go build ./cmd/consumer: %w\n%s", err, out)
	}
	for _, procs := range []int{1, 3} {
		progress("scale-out: %d consumer process(es), %d prompts, %d partitions", procs, n, partitions)
		r, err := scaleOutOnce(ctx, sc, bin, n, partitions, procs)
		if err != nil {
			return res, fmt.Errorf("%d processes: %w", procs, err)
		}
		if procs == 1 {
			res.One = r
		} else {
			res.Three = r
		}
	}
	res.Ratio = res.Three.Rate / res.One.Rate
	return res, nil
}

func scaleOutOnce(ctx context.Context, sc *scratchServer, bin string, n int, partitions int32, procs int) (run scaleOutRun, err error) {
	w, err := newWorkload(n)
	if err != nil {
		return run, err
	}
	broker, err := startBroker(partitions)
	if err != nil {
		return run, err
	}
	defer broker.Close()
	db, err := sc.create(ctx, poolOpts{MaxConns: 2})
	if err != nil {
		return run, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()
	u := sc.dbURL(db.Name)

	answered, stopReader, err := countTurns(broker.Addr(), w, nil)
	if err != nil {
		return run, err
	}
	defer stopReader()

	group := "bench-scaleout-" + db.Name
	var ps []*benchProc
	defer func() {
		for _, p := range ps {
			err = errors.Join(err, p.stop())
		}
	}()
	for i := range procs {
		p, err := startBenchProc(ctx, bin, fmt.Sprintf("consumer-%d", i+1), "--brokers", broker.Addr(), "--database-url", u,
			"--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(partitions), "--group", group,
			"--db-max-conns", fmt.Sprint(scaleOutMaxConns), "--log-level", "info")
		if err != nil {
			return run, err
		}
		ps = append(ps, p)
	}
	if err := waitStableGroup(ctx, ps, time.Minute); err != nil {
		return run, err
	}

	cpu0 := sampleCPU()
	start := time.Now()
	if err := prefill(ctx, []string{broker.Addr()}, "prompts", w); err != nil {
		return run, err
	}
	select {
	case <-answered:
	case <-ctx.Done():
		return run, ctx.Err()
	case <-time.After(10 * time.Minute):
		return run, fmt.Errorf("not every prompt was answered within 10 minutes")
	}
	secs := time.Since(start).Seconds()
	return scaleOutRun{Processes: procs, Prompts: n, Seconds: secs, Rate: float64(n) / secs, CPU: cpuBetween(cpu0, sampleCPU())}, nil
}

// dbURL is the URL of database name on the scratch server, for a consumer
// process.
func (s *scratchServer) dbURL(name string) string {
	u := &url.URL{Scheme: "postgres", Host: fmt.Sprintf("%s:%d", s.admin.Host, s.admin.Port), Path: "/" + name}
	q := url.Values{}
	if strings.HasPrefix(s.admin.Host, "/") { // a Unix socket directory
		u.Host = ""
		q.Set("host", s.admin.Host)
		q.Set("port", fmt.Sprint(s.admin.Port))
	}
	if s.admin.User != "" {
		u.User = url.UserPassword(s.admin.User, s.admin.Password)
	}
	if s.admin.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// countTurns reads session-events and closes the returned channel once
// every prompt of w has a turn event. turns, when not nil, counts the
// turn events that answer prompts of w.
func countTurns(addr string, w *workload, turns *atomic.Int64) (<-chan struct{}, func(), error) {
	c, err := sarama.NewConsumer([]string{addr}, kafkautil.NewConfig("bench-scaleout-events"))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting events reader: %w", err)
	}
	parts, err := c.Partitions("session-events")
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	want := make(map[string]bool, len(w.prompts))
	for _, p := range w.prompts {
		want[p.MessageID] = true
	}
	var mu sync.Mutex
	done := make(chan struct{})
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		pc, err := c.ConsumePartition("session-events", p, sarama.OffsetOldest)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				e, err := envelope.DecodeEvent(m.Value)
				if err != nil || (e.Type != envelope.EventTurnCompleted && e.Type != envelope.EventTurnFailed) {
					continue
				}
				mu.Lock()
				if turns != nil && len(e.MessageIDs) > 0 && want[e.MessageIDs[0]] {
					turns.Add(1)
				}
				for _, id := range e.MessageIDs {
					if want[id] {
						delete(want, id)
						if len(want) == 0 {
							close(done)
						}
					}
				}
				mu.Unlock()
			}
		})
		wg.Go(func() {
			for range pc.Errors() {
			}
		})
	}
	return done, func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		c.Close()
	}, nil
}

// benchProc is one consumer process.
type benchProc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	exited chan struct{}
}

func (p *benchProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

func (p *benchProc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func startBenchProc(ctx context.Context, bin, name string, args ...string) (*benchProc, error) {
	p := &benchProc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop sends SIGTERM and waits, SIGKILL after 30s.
func (p *benchProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within 30s of SIGTERM", p.name)
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("%s ended with %s:\n%s", p.name, p.cmd.ProcessState, tail(p.logs(), 20))
	}
	return nil
}

// waitStableGroup waits until every process's latest assignment belongs to
// one generation and holds prompts partitions.
func waitStableGroup(ctx context.Context, ps []*benchProc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		gens := map[float64]bool{}
		ok := true
		for _, p := range ps {
			select {
			case <-p.exited:
				return fmt.Errorf("%s exited (%s):\n%s", p.name, p.cmd.ProcessState, tail(p.logs(), 20))
			default:
			}
			var last map[string]any
			for l := range strings.Lines(p.logs()) {
				var line map[string]any
				if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == "partitions assigned" {
					last = line
				}
			}
			claims, _ := last["claims"].(map[string]any)
			parts, _ := claims["prompts"].([]any)
			gen, _ := last["generation"].(float64)
			ok = ok && len(parts) > 0
			gens[gen] = true
		}
		if ok && len(gens) == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the consumer group did not settle within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

func printScaleOut(out io.Writer, r *scaleOutResult) {
	fmt.Fprintf(out, "\nscale-out: admission + execution, %d prompts over %d sessions (produced once the group is stable; timed to the last turn event), --db-max-conns %d per process:\n",
		r.One.Prompts, max(1, r.One.Prompts/sessionsPer), scaleOutMaxConns)
	for _, run := range []scaleOutRun{r.One, r.Three} {
		fmt.Fprintf(out, "  %d process(es): %.0f prompts/s (%.2fs); CPU %.2f cores busy\n", run.Processes, run.Rate, run.Seconds, run.CPU.Machine)
	}
	fmt.Fprintf(out, "  three / one: %.2f — on this %s-core machine the processes share the same cores and the same Postgres, so the ratio shows the overhead of scale-out (rebalances, more connections, three relays and recovery loops), not a speed-up; spread the processes over machines to gain throughput\n",
		r.Ratio, fmt.Sprint(runtime.NumCPU()))
}
