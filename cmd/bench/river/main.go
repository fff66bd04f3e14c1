// Command river is the peer of promptline's burn-down in cmd/bench: River's
// no-op burn-down on the same Postgres, written from River's public API.
// It lives in a Go module of its own so that River never becomes a
// dependency of promptline's main module. It migrates River's tables into
// the database it is given, inserts --jobs no-op jobs, starts a client
// with --workers workers and times it from its start to the last job
// completed, then prints one JSON object on stdout.
//
// The client fetches as River's own benchmark (cmd/river/riverbench in
// River's repository) configures it: FetchCooldown 2 ms and
// FetchPollInterval 20 ms. With River's defaults (100 ms and 1 s) a
// client fetches at most its free workers every 100 ms, so 200 workers
// cap the burn-down at 2,000 jobs/s whatever the database can do; that
// would measure River's pacing, not the queue (docs/benchmarks.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// noopArgs is a job that does nothing: the burn-down measures the queue.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (*noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// result is what the bench reads.
type result struct {
	Jobs    int `json:"jobs"`
	Workers int `json:"workers"`
	// FetchCooldownMS and FetchPollIntervalMS are the client's fetch
	// pacing (milliseconds).
	FetchCooldownMS     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMS float64 `json:"fetch_poll_interval_ms"`
	Seconds             float64 `json:"seconds"`
	JobsPerSecond       float64 `json:"jobs_per_second"`
}

func main() {
	url := flag.String("database-url", "", "Postgres URL of an empty database (River's tables are migrated into it)")
	jobs := flag.Int("jobs", 100000, "no-op jobs inserted before the client starts")
	workers := flag.Int("workers", 200, "MaxWorkers of the default queue")
	maxConns := flag.Int("db-max-conns", 32, "pool size")
	cooldown := flag.Duration("fetch-cooldown", 2*time.Millisecond, "the client's FetchCooldown (River's own benchmark's setting; River's default is 100ms)")
	poll := flag.Duration("fetch-poll-interval", 20*time.Millisecond, "the client's FetchPollInterval (River's own benchmark's setting; River's default is 1s)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	r, err := run(ctx, *url, *jobs, *workers, int32(*maxConns), *cooldown, *poll)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func run(ctx context.Context, url string, jobs, workers int, maxConns int32, cooldown, poll time.Duration) (res result, err error) {
	if url == "" || jobs < 1 || workers < 1 {
		return res, errors.New("--database-url, --jobs ≥ 1 and --workers ≥ 1 are required")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return res, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return res, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return res, fmt.Errorf("migrating River: %w", err)
	}

	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     cooldown,
		FetchPollInterval: poll,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
	})
	if err != nil {
		return res, err
	}
	const chunk = 5000
	params := make([]river.InsertManyParams, 0, chunk)
	for start := 0; start < jobs; start += chunk {
		params = params[:0]
		for range min(chunk, jobs-start) {
			params = append(params, river.InsertManyParams{Args: noopArgs{}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return res, fmt.Errorf("inserting jobs: %w", err)
		}
	}

	completed, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: jobs + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err = errors.Join(err, client.Stop(stopCtx))
	}()
	for n := 0; n < jobs; {
		select {
		case <-completed:
			n++
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(5 * time.Minute):
			return res, fmt.Errorf("%d of %d jobs completed, none in the last 5 minutes", n, jobs)
		}
	}
	secs := time.Since(start).Seconds()
	var done int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&done); err != nil {
		return res, err
	}
	if done != jobs {
		return res, fmt.Errorf("%d completed events but %d completed jobs in river_job", jobs, done)
	}
	return result{
		Jobs: jobs, Workers: workers,
		FetchCooldownMS: ms(cooldown), FetchPollIntervalMS: ms(poll),
		Seconds: secs, JobsPerSecond: float64(jobs) / secs,
	}, nil
}

func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}
