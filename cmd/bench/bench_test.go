package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// TestMeasurements runs every measurement at a tiny scale so that the
// bench cannot rot: each must finish and return sane figures.
func TestMeasurements(t *testing.T) {
	ctx := context.Background()
	// The command's own resolution: DATABASE_URL, else the local server,
	// else a throwaway cluster (testkit's databases belong to a user that
	// may not create databases).
	sc, err := newScratchServer(t.Context(), os.Getenv("DATABASE_URL"), t.Logf)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sc.close(context.Background())) })
	const n, partitions = 200, 4
	w, err := newWorkload(n)
	require.NoError(t, err)

	t.Run("RawCeiling", func(t *testing.T) {
		db, err := sc.create(ctx, poolOpts{})
		require.NoError(t, err)
		r, err := measureRaw(ctx, db.Pool, w.byPartition(partitions), 50)
		require.NoError(t, err)
		var count int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM inputs").Scan(&count))
		require.Equal(t, n, count)
		require.NoError(t, db.drop(ctx))
		require.Equal(t, n, r.Prompts)
		require.Positive(t, r.Rate)
	})

	t.Run("Admission", func(t *testing.T) {
		b, err := startBroker(partitions)
		require.NoError(t, err)
		defer b.Close()
		require.NoError(t, prefill(ctx, []string{b.Addr()}, "prompts", w))
		r, err := measureAdmission(ctx, sc, []string{b.Addr()}, n, admissionOpts{MaxBatch: 50, Timeout: time.Minute})
		require.NoError(t, err)
		require.Equal(t, n, r.Prompts)
		require.Positive(t, r.Rate)
		require.Positive(t, r.Batches)
		require.LessOrEqual(t, r.MeanBatch, 50.0)
	})

	t.Run("Latency", func(t *testing.T) {
		r, err := measureLatency(ctx, sc, latencyOpts{
			Partitions: partitions, Rate: 50, Duration: 2 * time.Second,
			Warmup: 200 * time.Millisecond, Drain: 20 * time.Second,
		})
		require.NoError(t, err)
		require.Greater(t, r.Sent, 80)
		require.Positive(t, r.Measured)
		require.Equal(t, r.Measured, r.Completed, "every measured prompt answered")
		require.Zero(t, r.Missing)
		require.Positive(t, r.Turn.P50)
		require.GreaterOrEqual(t, r.Turn.Max, r.Turn.P99)
		require.GreaterOrEqual(t, r.Turn.P99, r.Turn.P50)
		require.Positive(t, r.Admitted.P50)
		require.Len(t, r.Stages, 4)
		require.Positive(t, r.Commits)
	})

	t.Run("LatencyOnlyCommand", func(t *testing.T) {
		profile := filepath.Join(t.TempDir(), "cpu.prof")
		cmd := newRootCommand()
		var stdout, stderr bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetArgs([]string{"--latency-only", "--rate", "50", "--duration", "2s", "--partitions", "4",
			"--latency-cpuprofile", profile})
		require.NoError(t, cmd.ExecuteContext(ctx), stderr.String())
		out := stdout.String()
		require.Contains(t, out, "offered 50/s")
		require.Contains(t, out, "send → turn.completed seen: p50")
		require.NotContains(t, out, "raw ceiling", "the latency run alone")
		info, err := os.Stat(profile)
		require.NoError(t, err)
		require.Positive(t, info.Size(), "a CPU profile of the load")
	})

	t.Run("ScaleOut", func(t *testing.T) {
		r, err := measureScaleOut(ctx, sc, n, partitions, func(string, ...any) {})
		require.NoError(t, err)
		require.Equal(t, 1, r.One.Processes)
		require.Equal(t, 3, r.Three.Processes)
		require.Equal(t, n, r.Three.Prompts)
		require.Positive(t, r.One.Rate)
		require.Positive(t, r.Three.Rate)
		require.InDelta(t, r.Three.Rate/r.One.Rate, r.Ratio, 1e-9)
		var out bytes.Buffer
		printScaleOut(&out, &r)
		require.Contains(t, out.String(), "not a speed-up")
	})

	// The burn-downs (a consumer process on a pre-filled topic), the turn
	// ceiling on their rows and the latency at half their rate, through
	// the command.
	t.Run("BurnDownOnlyCommand", func(t *testing.T) {
		cmd := newRootCommand()
		var stdout, stderr bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetArgs([]string{"--burndown-only", "--burndown-prompts", "200", "--river-jobs", "300", "--river-workers", "20", "--rate", "50", "--duration", "2s",
			"--partitions", "4", "--json"})
		require.NoError(t, cmd.ExecuteContext(ctx), stderr.String())
		var rep report
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep))
		b := rep.BurnDown
		require.NotNil(t, b)
		require.Equal(t, 1, b.One.PromptsPerSession)
		require.Equal(t, 10, b.Ten.PromptsPerSession)
		require.EqualValues(t, 200, b.One.Turns, "one turn per single-prompt session")
		require.GreaterOrEqual(t, b.Ten.Turns, int64(200/10), "at least a turn per session")
		tables := map[string]tableWrites{}
		var left int64
		for _, tw := range b.One.Tables {
			tables[tw.Table] = tw
			left += tw.Left
		}
		require.EqualValues(t, 200, tables["inputs"].Inserted)
		require.EqualValues(t, 200, tables["inputs"].Left)
		require.EqualValues(t, 200, tables["claims"].Deleted, "every claim released")
		require.EqualValues(t, left, b.Ceiling.Rows, "the ceiling writes every row the burn-down left")
		require.Positive(t, b.Ceiling.TurnsPerSecond)
		require.InDelta(t, b.One.TurnsPerSecond/b.Ceiling.TurnsPerSecond, b.Efficiency, 1e-9)
		for _, r := range []burnDownRun{b.One, b.Ten} {
			require.Positive(t, r.TurnsPerSecond)
			require.Positive(t, r.ConsumerCPUMillisPerTurn)
			require.Positive(t, r.CommitsPerTurn)
			// A turn writes rows: a few hundred bytes of WAL at least, and
			// far less than a megabyte.
			require.Greater(t, r.WALBytesPerTurn, 200.0)
			require.Less(t, r.WALBytesPerTurn, float64(1<<20))
			if sc.cluster != nil { // the bench's own cluster: its processes and pg_stat_statements
				require.Positive(t, r.PostgresCPUMillisPerTurn)
				require.Greater(t, r.StatementsPerTurn, 1.0)
				require.Positive(t, r.NestedStatementsPerTurn)
				// The breakdown is the same count, statement by statement
				// (a statement's text cut for print is still one entry).
				var sum float64
				for _, u := range r.Statements {
					sum += u.PerTurn
				}
				require.InDelta(t, r.StatementsPerTurn, sum, 1e-6)
				require.True(t, slices.ContainsFunc(r.Statements, func(u statementUse) bool { return strings.Contains(u.Query, "INSERT INTO inputs") }),
					"admission's insert is among them: %v", r.Statements)
				// And the statements inside the functions, the same way:
				// the claim's row the turn's functions write is among them.
				sum = 0
				for _, u := range r.Nested {
					sum += u.PerTurn
				}
				require.InDelta(t, r.NestedStatementsPerTurn, sum, 1e-6)
				require.True(t, slices.ContainsFunc(r.Nested, func(u statementUse) bool { return strings.Contains(u.Query, "INTO claims") }),
					"the claim's insert is among them: %v", r.Nested)
			}
		}
		if sc.admin.TLSConfig == nil && !strings.HasPrefix(sc.admin.Host, "/") {
			require.NotNil(t, b.Trips, "round trips counted through the proxy")
			require.EqualValues(t, 40, b.Trips.Turns)
			require.Positive(t, b.Trips.RoundTripsPerTurn)
		}
		// The turns of the tool run each called the echo tool once, and
		// succeeded: two attempts and a call a turn, all of them answered.
		require.NotNil(t, b.Tools, "the burn-down with a tool call a turn")
		require.EqualValues(t, 100, b.Tools.Turns)
		toolTables := map[string]tableWrites{}
		for _, tw := range b.Tools.Tables {
			toolTables[tw.Table] = tw
		}
		require.EqualValues(t, 100, toolTables["tool_calls"].Left, "one call a turn")
		require.EqualValues(t, 200, toolTables["attempts"].Left, "two provider steps a turn")
		require.Positive(t, b.Tools.ConsumerCPUMillisPerTurn)
		require.Greater(t, b.Tools.CommitsPerTurn, b.One.CommitsPerTurn, "a tool turn writes transactions of its own")
		require.NotNil(t, b.Half, "the cost per turn at half the burn-down, from a consumer process")
		require.InDelta(t, b.One.TurnsPerSecond/2, b.Half.OfferedRate, 1e-9)
		require.EqualValues(t, b.Half.Prompts, b.Half.Turns, "every paced prompt answered")
		require.Positive(t, b.Half.ConsumerCPUMillisPerTurn)
		if sc.cluster != nil {
			require.Greater(t, b.Half.StatementsPerTurn, 1.0)
		}
		h := rep.HalfLatency
		require.NotNil(t, h)
		require.InDelta(t, b.One.TurnsPerSecond/2, h.OfferedRate, 1e-9)
		require.Zero(t, h.Missing)
		require.Positive(t, h.Completed)
		require.Positive(t, rep.Latency.Completed, "the run at --rate next to it")
		require.NotNil(t, rep.River, "River's no-op burn-down, same run")
		require.Equal(t, 300, rep.River.Jobs)
		require.Positive(t, rep.River.JobsPerSecond)
		// River's own benchmark's fetch pacing: with River's defaults
		// (100 ms) 200 workers cap the peer at 2,000 jobs/s.
		require.InDelta(t, 2.0, rep.River.FetchCooldownMS, 1e-9)
		require.InDelta(t, 20.0, rep.River.FetchPollIntervalMS, 1e-9)
		require.InDelta(t, b.One.TurnsPerSecond/rep.River.JobsPerSecond, rep.RiverRatio, 1e-9)
		var out bytes.Buffer
		printBurnDown(&out, &rep)
		require.Contains(t, out.String(), "burn-down / River's")
		require.Contains(t, out.String(), "burn-down / turn ceiling")
		require.Contains(t, out.String(), "burn-down, 100 prompts, 1 per session, one tool call a turn (turns/s)")
		require.Contains(t, out.String(), "(half the burn-down): CPU per turn, consumer + Postgres (ms)")
		if sc.cluster != nil {
			require.Contains(t, out.String(), "statements per turn, sent by the client (per turn, mean ms, statement):")
		}
		require.Contains(t, out.String(), fmt.Sprintf("end-to-end p99 (ms) at %.0f/s (half the burn-down)", h.OfferedRate))
	})

	// One Apache Kafka node (Java 17 and Maven, as make test/kafka): the
	// admission, latency and replay runs on both brokers, and their ratios.
	t.Run("KafkaBoth", func(t *testing.T) {
		cmd := newRootCommand()
		var stdout, stderr bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetArgs([]string{"--kafka", "both", "--prompts", "200", "--rate", "50", "--duration", "2s", "--partitions", "4",
			"--replay-prompts", "300", "--knobs=false", "--scaleout=false", "--json"})
		require.NoError(t, cmd.ExecuteContext(ctx), stderr.String())
		var rep report
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep))
		require.Equal(t, "embedded, apache", rep.Machine["kafka"])
		require.NotNil(t, rep.Apache, "the Apache Kafka figures")
		for name, f := range map[string]kafkaFigures{"embedded": {rep.Admission, rep.Latency, rep.Replay}, "apache": *rep.Apache} {
			require.Equal(t, 200, f.Admission.Prompts, name)
			require.Positive(t, f.Admission.Rate, name)
			require.Zero(t, f.Latency.Missing, name)
			require.Positive(t, f.Latency.Completed, name)
			require.NotNil(t, f.Replay, name)
			require.Equal(t, int64(300), f.Replay.Fresh.Admitted, name)
			require.Equal(t, int64(300), f.Replay.Duplicates.Dupes, name)
		}
		var table bytes.Buffer
		printKafkaComparison(&table, &rep)
		require.Contains(t, table.String(), "Apache / embedded")
		require.Contains(t, table.String(), fmt.Sprintf("%.2f", rep.Apache.Admission.Rate/rep.Admission.Rate))
		require.Regexp(t, `Apache Kafka: serving metadata after`, stderr.String())
	})

	t.Run("KafkaFlag", func(t *testing.T) {
		cmd := newRootCommand()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs([]string{"--kafka", "redpanda"})
		require.ErrorContains(t, cmd.ExecuteContext(ctx), "--kafka must be embedded, apache or both")
	})

	names, err := sc.serverFacts(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, names["server_version"])
}

// TestInFlight runs `bench inflight` small: every turn sleeps on the
// scripted provider, so the turns pile up in one consumer process; the
// figures must be produced and plausible.
func TestInFlight(t *testing.T) {
	const rate, sleep, burst = 100, 2 * time.Second, 200
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"inflight", "--kafka", "embedded", "--rate", fmt.Sprint(rate), "--duration", "2s", "--sleep", sleep.String(),
		"--burst", fmt.Sprint(burst), "--partitions", "4", "--json"})
	require.NoError(t, cmd.ExecuteContext(context.Background()), stderr.String())
	var r inFlightResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r))
	require.Equal(t, 10000, r.MaxSessions)
	require.EqualValues(t, 32, r.PoolSize)

	s := r.Steady
	require.Greater(t, s.Sent, rate)
	require.Positive(t, s.Measured)
	require.Equal(t, s.Measured, s.Completed, "every measured prompt answered")
	require.Zero(t, s.Failed)
	require.Zero(t, s.Missing)
	// No turn completes before its provider's sleep: the overhead is
	// what the pipeline adds on top of it.
	require.GreaterOrEqual(t, s.Overhead.P50, 0.0)
	require.GreaterOrEqual(t, s.Overhead.P99, s.Overhead.P50)
	require.Less(t, s.Overhead.P99, float64(sleep.Milliseconds()), "a turn's overhead far below its sleep at this rate")
	// At 100/s with 2s turns, about 200 are in flight at once.
	require.Greater(t, s.Peaks.InFlight, rate)
	require.Greater(t, s.Peaks.Executions, rate/2, "the consumer executes the sleeping turns at once")
	require.Greater(t, s.Peaks.Goroutines, 10)
	require.Greater(t, s.Peaks.RSSBytes, int64(8<<20))
	require.Less(t, s.Peaks.RSSBytes, int64(4<<30))
	// Where the RSS is: the stacks of the goroutines counted (8 KiB at
	// least for each execution's) and the heap, each a part of it.
	require.Greater(t, s.Peaks.StackBytes, int64(s.Peaks.Executions)*4<<10, "stacks in use: at least a small stack per execution")
	require.Positive(t, s.Peaks.HeapBytes)
	require.Less(t, s.Peaks.StackBytes+s.Peaks.HeapBytes, s.Peaks.RSSBytes+s.Peaks.RSSBytes/2, "stacks and heap are parts of the RSS (sampled at different moments)")
	require.Positive(t, s.Peaks.Connections)
	require.LessOrEqual(t, s.Peaks.Connections, int(r.PoolSize))
	require.LessOrEqual(t, s.Peaks.Busy, s.Peaks.Connections)
	// The legs of the path: the provider's sleep is inside the third, and
	// every leg was measured (a leg with no timestamps reads 0) and takes
	// some time.
	require.Len(t, s.Stages, 4)
	require.GreaterOrEqual(t, s.Stages[2].P50, float64(sleep.Milliseconds()), "the sleep is in the provider's leg")
	for _, st := range s.Stages {
		require.Positive(t, st.P50, st.Name)
		require.GreaterOrEqual(t, st.P99, st.P50, st.Name)
	}

	b := r.Burst
	require.NotNil(t, b)
	require.Equal(t, burst, b.Prompts)
	require.EqualValues(t, burst, b.Attempts, "one provider attempt per prompt")
	require.Positive(t, b.FirstStartSeconds)
	require.GreaterOrEqual(t, b.LastStartSeconds, b.FirstStartSeconds)
	require.GreaterOrEqual(t, b.CompletedSeconds, sleep.Seconds(), "answered only after the sleep")
	require.Less(t, b.LastStartSeconds, b.CompletedSeconds)
	require.Positive(t, b.StartsPerSecond)
	require.Positive(t, b.Peaks.RSSBytes)

	var out bytes.Buffer
	printInFlight(&out, &r)
	require.Contains(t, out.String(), "overhead p99 (ms past the sleep)")
	require.Contains(t, out.String(), fmt.Sprintf("burst of %d: last turn started after (s)", burst))
	require.Contains(t, out.String(), "≤ 32 (pool)")
}

// TestInFlightToolTurns: with --tool-turns each turn asks for a tool at
// once and waits in its second step: two provider attempts a turn, and
// no turn completes before the sleep, so that only a second step that
// waited (/sleep-after-tools honoured after the tool's result) gives an
// overhead that is not negative.
func TestInFlightToolTurns(t *testing.T) {
	const rate, sleep, burst = 50, 2 * time.Second, 50
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"inflight", "--kafka", "embedded", "--rate", fmt.Sprint(rate), "--duration", "2s", "--sleep", sleep.String(),
		"--tool-turns", "--burst", fmt.Sprint(burst), "--partitions", "4", "--json"})
	require.NoError(t, cmd.ExecuteContext(context.Background()), stderr.String())
	var r inFlightResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r))
	require.True(t, r.ToolTurns)
	require.NotNil(t, r.Burst)
	require.EqualValues(t, 2*burst, r.Burst.Attempts, "two provider attempts a turn: the one that asks for the tool, the one that answers its result")
	require.GreaterOrEqual(t, r.Burst.CompletedSeconds, sleep.Seconds(), "answered only after the second step's sleep")
	s := r.Steady
	require.Positive(t, s.Measured)
	require.Equal(t, s.Measured, s.Completed, "every measured prompt answered")
	require.GreaterOrEqual(t, s.Overhead.P50, 0.0, "the second step waited its sleep")
	require.Less(t, s.Overhead.P99, float64(sleep.Milliseconds()))
	require.Greater(t, s.Peaks.Executions, rate/2, "the consumer executes the waiting turns at once")

	var out bytes.Buffer
	printInFlight(&out, &r)
	require.Contains(t, out.String(), "a tool, then /sleep-after-tools 2s")
}
