package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// options are the bench's flags.
type options struct {
	databaseURL string
	prompts     int
	rate        float64
	duration    time.Duration
	partitions  int32
	json        bool
	knobs       bool
	cpuProfile  string
	// latencyOnly runs the end-to-end latency run alone.
	latencyOnly       bool
	latencyCPUProfile string
	// replayPrompts is the size of the replay runs (replay.go); 0 skips them.
	replayPrompts int
	// scaleOut runs one and three consumer processes (scaleout.go).
	scaleOut        bool
	scaleOutPrompts int
	// burnDown runs the burn-downs, the turn ceiling and the latency at
	// half of the burn-down's rate (burndown.go); burnDownOnly runs them
	// alone.
	burnDown        bool
	burnDownOnly    bool
	burnDownPrompts int
	// burnDownToolTurns adds a burn-down whose turns each call a tool.
	burnDownToolTurns bool
	// riverJobs sizes River's no-op burn-down next to it (river.go); 0
	// skips it.
	riverJobs    int
	riverWorkers int
	// kafka is --kafka: embedded, apache or both (kafka.go).
	kafka string
	// channelBuffers, when set, runs only admission, once per size in
	// this order (alternate them: A B A B), on one pre-filled topic.
	channelBuffers []int
}

func newRootCommand() *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:           "bench",
		Short:         "Measure admission throughput and end-to-end latency against Postgres and the embedded broker",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	root.AddCommand(newInFlightCommand())
	root.AddCommand(newStreamCommand())
	f := root.Flags()
	f.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"Postgres server URL (env DATABASE_URL; default postgres://127.0.0.1:5432/postgres); scratch databases promptline_bench_<random> are created there and dropped")
	f.IntVar(&o.prompts, "prompts", 100000, "prompts admitted by the raw-ceiling and admission runs")
	f.Float64Var(&o.rate, "rate", 1000, "prompts per second offered in the latency run")
	f.DurationVar(&o.duration, "duration", 20*time.Second, "length of the latency run (the first tenth, at most 2s, is warm-up)")
	f.Int32Var(&o.partitions, "partitions", 16, "partitions of every topic")
	f.BoolVar(&o.json, "json", false, "print the results as JSON")
	f.BoolVar(&o.knobs, "knobs", true, "also measure the knobs (batch size, fetch buffer, pool size, synchronous_commit, partitions) against the shipped defaults")
	f.IntVar(&o.replayPrompts, "replay-prompts", 1000000, "prompts in the topic of the replay runs (fresh, then all duplicates); 0 skips them")
	f.BoolVar(&o.scaleOut, "scaleout", true, "also measure admission + execution with three consumer processes next to one (builds ./cmd/consumer with the go tool)")
	f.IntVar(&o.scaleOutPrompts, "scaleout-prompts", 20000, "prompts of each scale-out run")
	f.BoolVar(&o.burnDown, "burndown", true, "also measure the burn-down (one consumer process working off a pre-filled prompts topic, one prompt per session, then ten), the turn ceiling, the cost per turn and the latency at half of the burn-down's rate (builds ./cmd/consumer with the go tool)")
	f.BoolVar(&o.burnDownOnly, "burndown-only", false, "run only the burn-down measurements and the latency at half of its rate (for work on the hot path)")
	f.IntVar(&o.burnDownPrompts, "burndown-prompts", 50000, "prompts of each burn-down run")
	f.BoolVar(&o.burnDownToolTurns, "burndown-tool-turns", true, "also burn down half as many prompts, one per session, whose turns each call the echo tool once (two provider steps and a call: an agent's turn)")
	f.IntVar(&o.riverJobs, "river-jobs", 100000, "jobs of River's no-op burn-down on the same Postgres, run with the burn-down (builds cmd/bench/river, its own Go module); 0 skips it")
	f.IntVar(&o.riverWorkers, "river-workers", 200, "workers of River's no-op burn-down")
	f.StringVar(&o.kafka, "kafka", kafkaEmbedded, "broker of the admission, end-to-end latency and replay runs: embedded, apache (a single-node Apache Kafka started with scripts/kafka.sh; no knobs, no scale-out) or both (each figure on both, with the ratio Apache/embedded)")
	f.IntSliceVar(&o.channelBuffers, "channel-buffers", nil, "run only admission, once per Sarama ChannelBufferSize in this order (alternate them, e.g. 1024,64,1024,64), on one pre-filled topic, and print each run's rate and its ratio to the first")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the baseline admission run to this file")
	f.BoolVar(&o.latencyOnly, "latency-only", false, "run only the end-to-end latency run (for work on the executor's path)")
	f.StringVar(&o.latencyCPUProfile, "latency-cpuprofile", "", "write a CPU profile of the baseline latency run to this file")
	return root
}

func (o *options) validate() error {
	switch {
	case o.prompts < 1:
		return errors.New("--prompts must be at least 1")
	case o.rate <= 0:
		return errors.New("--rate must be positive")
	case o.duration <= 0:
		return errors.New("--duration must be positive")
	case o.replayPrompts < 0:
		return errors.New("--replay-prompts must not be negative")
	case o.scaleOut && o.scaleOutPrompts < 1:
		return errors.New("--scaleout-prompts must be at least 1")
	case (o.burnDown || o.burnDownOnly) && o.burnDownPrompts < 1:
		return errors.New("--burndown-prompts must be at least 1")
	case o.riverJobs < 0 || o.riverWorkers < 1:
		return errors.New("--river-jobs must not be negative and --river-workers must be at least 1")
	case o.latencyOnly && o.burnDownOnly:
		return errors.New("--latency-only and --burndown-only exclude each other")
	case o.partitions < 1:
		return errors.New("--partitions must be at least 1")
	}
	for _, n := range o.channelBuffers {
		if n < 1 {
			return fmt.Errorf("--channel-buffers: every size must be at least 1, got %d", n)
		}
	}
	if _, err := kafkaModes(o.kafka); err != nil {
		return err
	}
	if (o.latencyOnly || o.burnDownOnly) && o.kafka != kafkaEmbedded {
		return errors.New("--latency-only and --burndown-only run on the embedded broker")
	}
	if o.latencyOnly && o.kafka != kafkaEmbedded {
		return errors.New("--latency-only runs on the embedded broker; --kafka apache or both runs the latency run next to admission and replay")
	}
	return nil
}
