package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// What streaming costs (issue 19): the burn-down of one consumer process,
// once with an answer returned whole and once with the same answer
// streamed as live deltas (the scripted provider's /stream), alternated
// over rounds on fresh topics and databases, so that the machine's drift
// falls on both alike. The gap between words is a microsecond: the figure
// is the pipeline's cost of coalescing and publishing deltas, not a
// model's pace.

// streamAnswer is the answer of every turn: 64 words, about 400 bytes,
// one or two coalesced deltas per step.
var streamAnswer = strings.TrimSpace(strings.Repeat("the quick brown fox jumps over the lazy dog ", 7) + "and so on")

type streamOptions struct {
	databaseURL string
	prompts     int
	rounds      int
	partitions  int32
	rate        float64
	duration    time.Duration
	json        bool
}

type streamResult struct {
	Prompts int              `json:"prompts"`
	Rounds  int              `json:"rounds"`
	Whole   []burnDownRun    `json:"whole"`
	Stream  []burnDownRun    `json:"streamed"`
	Ratios  streamRatioTable `json:"ratios"`
	// Latency at a fixed offered rate, send → turn.completed: each
	// prompt its own session, the pipeline in the bench's process.
	Rate          float64         `json:"latency_offered_per_second"`
	LatencyWhole  []latencyResult `json:"latency_whole"`
	LatencyStream []latencyResult `json:"latency_streamed"`
}

// streamRatioTable compares the medians: streamed / whole.
type streamRatioTable struct {
	TurnsPerSecond  float64 `json:"turns_per_second"`
	ConsumerCPU     float64 `json:"consumer_cpu_ms_per_turn"`
	PostgresCPU     float64 `json:"postgres_cpu_ms_per_turn"`
	CommitsPerTurn  float64 `json:"commits_per_turn"`
	StatementsTurn  float64 `json:"statements_per_turn"`
	WholeTurnsPerS  float64 `json:"whole_turns_per_second"`
	StreamTurnsPerS float64 `json:"streamed_turns_per_second"`
}

func newStreamCommand() *cobra.Command {
	o := &streamOptions{}
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "What live deltas cost: the burn-down with answers returned whole and streamed, alternated",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.prompts < 1 || o.rounds < 1 || o.partitions < 1 {
				return errors.New("--prompts, --rounds and --partitions must be at least 1")
			}
			return runStream(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.databaseURL, "database-url", "", "Postgres server for the scratch databases (empty: the local server, else a throwaway cluster)")
	f.IntVar(&o.prompts, "prompts", 10000, "prompts of each burn-down run, one per session")
	f.IntVar(&o.rounds, "rounds", 2, "pairs of runs (whole, then streamed)")
	f.Int32Var(&o.partitions, "partitions", 16, "partitions of the prompts and wakes topics")
	f.Float64Var(&o.rate, "rate", 300, "offered prompts per second of the latency runs (0 skips them)")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "length of each latency run")
	f.BoolVar(&o.json, "json", false, "print the results as JSON")
	return cmd
}

func runStream(ctx context.Context, o *streamOptions, stdout, stderr io.Writer) (err error) {
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	sc, err := newScratchServer(ctx, o.databaseURL, progress)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sc.close(ctx)) }()
	bin, cleanup, err := buildConsumer(ctx, progress)
	if err != nil {
		return err
	}
	defer cleanup()
	res := streamResult{Prompts: o.prompts, Rounds: o.rounds}
	whole, streamed := "/reply "+streamAnswer, "/stream 1us\n/reply "+streamAnswer
	for i := range o.rounds {
		for _, v := range []struct {
			name, text string
			into       *[]burnDownRun
		}{{"whole", whole, &res.Whole}, {"streamed", streamed, &res.Stream}} {
			progress("stream, round %d/%d: %d prompts, answers %s", i+1, o.rounds, o.prompts, v.name)
			r, _, err := burnDownOnce(ctx, sc, bin, o.prompts, 1, o.partitions, false, false, v.text, 0)
			if err != nil {
				return fmt.Errorf("burn-down, answers %s: %w", v.name, err)
			}
			if v.into == &res.Stream && r.DeltasPerTurn < 1 {
				return fmt.Errorf("answers streamed, but %.2f deltas per turn reached session-deltas: the measurement would compare nothing", r.DeltasPerTurn)
			}
			*v.into = append(*v.into, r)
		}
		if o.rate <= 0 {
			continue
		}
		res.Rate = o.rate
		for _, v := range []struct {
			name, text string
			deltas     bool
			into       *[]latencyResult
		}{{"whole", whole, false, &res.LatencyWhole}, {"streamed", streamed, true, &res.LatencyStream}} {
			progress("stream, round %d/%d: latency at %.0f/s for %s, answers %s", i+1, o.rounds, o.rate, o.duration, v.name)
			l, err := measureLatency(ctx, sc, latencyOpts{Pool: poolOpts{MaxConns: 8}, Partitions: o.partitions, Rate: o.rate,
				Duration: o.duration, Warmup: warmupFor(o.duration), Text: v.text, Deltas: v.deltas})
			if err != nil {
				return fmt.Errorf("latency, answers %s: %w", v.name, err)
			}
			switch {
			case l.Missing > 0 || l.Failed > 0:
				return fmt.Errorf("latency, answers %s: %d prompts unanswered, %d failed", v.name, l.Missing, l.Failed)
			case v.deltas && l.DeltasPublished < int64(l.Completed):
				return fmt.Errorf("latency, answers streamed: %d deltas for %d answers: the measurement would compare nothing", l.DeltasPublished, l.Completed)
			}
			*v.into = append(*v.into, l)
		}
	}
	med := func(runs []burnDownRun, f func(burnDownRun) float64) float64 {
		vs := make([]float64, len(runs))
		for i, r := range runs {
			vs[i] = f(r)
		}
		return median(vs)
	}
	ratio := func(f func(burnDownRun) float64) float64 {
		w := med(res.Whole, f)
		if w <= 0 {
			return -1
		}
		return med(res.Stream, f) / w
	}
	res.Ratios = streamRatioTable{
		TurnsPerSecond:  ratio(func(r burnDownRun) float64 { return r.TurnsPerSecond }),
		ConsumerCPU:     ratio(func(r burnDownRun) float64 { return r.ConsumerCPUMillisPerTurn }),
		PostgresCPU:     ratio(func(r burnDownRun) float64 { return r.PostgresCPUMillisPerTurn }),
		CommitsPerTurn:  ratio(func(r burnDownRun) float64 { return r.CommitsPerTurn }),
		StatementsTurn:  ratio(func(r burnDownRun) float64 { return r.StatementsPerTurn }),
		WholeTurnsPerS:  med(res.Whole, func(r burnDownRun) float64 { return r.TurnsPerSecond }),
		StreamTurnsPerS: med(res.Stream, func(r burnDownRun) float64 { return r.TurnsPerSecond }),
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(&res)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "live deltas (%d prompts per run, %d rounds, medians)\twhole\tstreamed\tstreamed/whole\t\n", o.prompts, o.rounds)
	row := func(name string, f func(burnDownRun) float64) {
		r := "-" // nothing to compare with: the whole runs had none
		if q := ratio(f); q >= 0 {
			r = fmt.Sprintf("%.2f", q)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%s\t\n", name, med(res.Whole, f), med(res.Stream, f), r)
	}
	row("turns/s", func(r burnDownRun) float64 { return r.TurnsPerSecond })
	row("consumer CPU ms/turn", func(r burnDownRun) float64 { return r.ConsumerCPUMillisPerTurn })
	row("Postgres CPU ms/turn", func(r burnDownRun) float64 { return r.PostgresCPUMillisPerTurn })
	row("commits/turn", func(r burnDownRun) float64 { return r.CommitsPerTurn })
	row("statements/turn", func(r burnDownRun) float64 { return r.StatementsPerTurn })
	row("deltas/turn", func(r burnDownRun) float64 { return r.DeltasPerTurn })
	if len(res.LatencyWhole) > 0 {
		lat := func(name string, f func(latencyResult) float64) {
			pick := func(ls []latencyResult) float64 {
				vs := make([]float64, len(ls))
				for i, l := range ls {
					vs[i] = f(l)
				}
				return median(vs)
			}
			w, st := pick(res.LatencyWhole), pick(res.LatencyStream)
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t\n", name, w, st, st/w)
		}
		lat(fmt.Sprintf("p50 ms at %.0f/s", res.Rate), func(l latencyResult) float64 { return l.Turn.P50 })
		lat(fmt.Sprintf("p99 ms at %.0f/s", res.Rate), func(l latencyResult) float64 { return l.Turn.P99 })
	}
	return tw.Flush()
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
