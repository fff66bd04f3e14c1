package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/replay"
)

// Goals of replay (issue 7).
const goalReplayDuplicates = 50000 // prompts/s

// replayRun is one replay of a whole topic.
type replayRun struct {
	Prompts  int64   `json:"prompts"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"prompts_per_second"`
	Admitted int64   `json:"admitted"`
	Dupes    int64   `json:"duplicates"`
	CPU      cpuUse  `json:"cpu"`
}

// replayResult is the replay figures of one bench run.
type replayResult struct {
	Prompts    int       `json:"prompts"`
	Partitions int32     `json:"partitions"`
	Fresh      replayRun `json:"fresh"`
	// FreshLiveSize replays the live admission run's own topic (--prompts
	// prompts) into a fresh database: the same size as the live figure.
	FreshLiveSize *replayRun `json:"fresh_live_size,omitempty"`
	Duplicates    replayRun  `json:"duplicates"`
	// DuplicatesSettled replays the duplicates again after VACUUM
	// (ANALYZE) of inputs: pages with hint bits set and no autovacuum
	// running, as in a database that has been live for a while. The first
	// duplicates run, right after the bulk load, pays for setting the hint
	// bits of a million fresh tuples (reads that write) and competes with
	// autovacuum.
	DuplicatesSettled replayRun `json:"duplicates_settled"`
	// DryRun replays the admitted topic again without writing: the cost of
	// reading, decoding and the read-only classification alone.
	DryRun replayRun `json:"dry_run"`
}

// measureReplay fills a topic of its own broker with n prompts, then
// replays it (the replay package, as `consumer replay` runs it: plain
// partition consumers, batches of 1000, no wake) into a fresh database:
// all fresh; then again: all duplicates; then a dry run.
//
// liveBrokers, when set, hold the live admission run's topic of liveN
// prompts: it is replayed first into a fresh database of its own, for a
// comparison with live admission at the same size.
//
// kb gives the topic's broker (nil: an embedded broker of its own).
func measureReplay(ctx context.Context, sc *scratchServer, kb kafkaBackend, n int, partitions int32, liveBrokers []string, liveN int, progress func(string, ...any)) (res replayResult, err error) {
	res = replayResult{Prompts: n, Partitions: partitions}
	if len(liveBrokers) > 0 {
		r, err := replayOnce(ctx, sc, liveBrokers, liveN, progress)
		if err != nil {
			return res, err
		}
		res.FreshLiveSize = &r
	}
	progress("replay: generating and producing %d prompts", n)
	w, err := newWorkload(n)
	if err != nil {
		return res, err
	}
	brokers, release, err := freshBrokers(kb, partitions)
	if err != nil {
		return res, err
	}
	defer release()
	if err := prefill(ctx, brokers, "prompts", w); err != nil {
		return res, err
	}
	w = nil // let the GC have the prompts back before measuring

	db, err := sc.create(ctx, poolOpts{})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()
	client, err := sarama.NewClient(brokers, replayConfig())
	if err != nil {
		return res, fmt.Errorf("connecting replay client: %w", err)
	}
	defer client.Close()

	one := func(name string, cfg replay.Config) (replayRun, error) {
		progress("replay: %s", name)
		ranges, err := replay.Resolve(client, "prompts", replay.Bounds{})
		if err != nil {
			return replayRun{}, err
		}
		r, err := replay.New(db.Pool, client, nil, &cfg)
		if err != nil {
			return replayRun{}, err
		}
		c0 := sampleCPU()
		rep, err := r.Run(ctx, "prompts", ranges)
		c1 := sampleCPU()
		if err != nil {
			return replayRun{}, fmt.Errorf("replay %s: %w", name, err)
		}
		if rep.Totals.Messages != int64(n) {
			return replayRun{}, fmt.Errorf("replay %s: %d of %d messages", name, rep.Totals.Messages, n)
		}
		secs := c1.at.Sub(c0.at).Seconds()
		return replayRun{Prompts: rep.Totals.Messages, Seconds: secs, Rate: float64(rep.Totals.Messages) / secs,
			Admitted: rep.Totals.Admitted, Dupes: rep.Totals.Duplicate, CPU: cpuBetween(c0, c1)}, nil
	}
	if res.Fresh, err = one("fresh (empty database)", replay.Config{}); err != nil {
		return res, err
	}
	if res.Fresh.Admitted != int64(n) {
		return res, fmt.Errorf("replay fresh: admitted %d of %d", res.Fresh.Admitted, n)
	}
	if res.Duplicates, err = one("duplicates (the same topic again)", replay.Config{}); err != nil {
		return res, err
	}
	if res.Duplicates.Dupes != int64(n) {
		return res, fmt.Errorf("replay duplicates: %d duplicates of %d", res.Duplicates.Dupes, n)
	}
	progress("replay: VACUUM (ANALYZE) inputs")
	if _, err := db.Pool.Exec(ctx, "VACUUM (ANALYZE) inputs"); err != nil {
		return res, fmt.Errorf("vacuuming inputs: %w", err)
	}
	if res.DuplicatesSettled, err = one("duplicates after VACUUM (ANALYZE)", replay.Config{}); err != nil {
		return res, err
	}
	if res.DryRun, err = one("dry run over admitted prompts", replay.Config{DryRun: true}); err != nil {
		return res, err
	}
	return res, nil
}

// replayConfig is the Kafka client's configuration of `consumer replay`
// at its defaults: a partition's channel holds --buffer-bytes counted at
// --max-value-bytes (32 messages).
func replayConfig() *sarama.Config {
	cfg := kafkautil.NewConfig("bench-replay")
	cfg.ChannelBufferSize = kafkautil.ChannelBufferFor(kafkautil.BufferBytesDefault, envelope.MaxValueBytesDefault)
	return cfg
}

// replayOnce replays a topic of n prompts into a fresh database of its own.
func replayOnce(ctx context.Context, sc *scratchServer, brokers []string, n int, progress func(string, ...any)) (res replayRun, err error) {
	progress("replay: fresh, %d prompts of the live admission topic", n)
	db, err := sc.create(ctx, poolOpts{})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()
	client, err := sarama.NewClient(brokers, replayConfig())
	if err != nil {
		return res, fmt.Errorf("connecting replay client: %w", err)
	}
	defer client.Close()
	ranges, err := replay.Resolve(client, "prompts", replay.Bounds{})
	if err != nil {
		return res, err
	}
	r, err := replay.New(db.Pool, client, nil, &replay.Config{})
	if err != nil {
		return res, err
	}
	c0 := sampleCPU()
	rep, err := r.Run(ctx, "prompts", ranges)
	c1 := sampleCPU()
	if err != nil {
		return res, err
	}
	if rep.Totals.Admitted != int64(n) {
		return res, fmt.Errorf("replay of the live topic: admitted %d of %d", rep.Totals.Admitted, n)
	}
	secs := c1.at.Sub(c0.at).Seconds()
	return replayRun{Prompts: rep.Totals.Messages, Seconds: secs, Rate: float64(n) / secs, Admitted: rep.Totals.Admitted, CPU: cpuBetween(c0, c1)}, nil
}

func printReplay(out io.Writer, r *replayResult, live admissionResult) {
	fmt.Fprintf(out, "\nreplay (%d prompts, %d partitions, batches of 1000, no wake; live admission of this run for comparison):\n", r.Prompts, r.Partitions)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "figure\tprompts/s\tseconds\tgoal\tmet?\tcores busy\tbench cores\t")
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	fmt.Fprintf(tw, "live admission\t%.0f\t%.2f\t\t\t%.2f\t%.2f\t\n", live.Rate, live.Seconds, live.CPU.Machine, live.CPU.Bench)
	f, d, y := r.Fresh, r.Duplicates, r.DryRun
	if l := r.FreshLiveSize; l != nil {
		fmt.Fprintf(tw, "replay, fresh, %d (live's topic)\t%.0f\t%.2f\t≥ live (%.0f)\t%s\t%.2f\t%.2f\t\n", l.Prompts, l.Rate, l.Seconds, live.Rate, met(l.Rate >= live.Rate), l.CPU.Machine, l.CPU.Bench)
	}
	fmt.Fprintf(tw, "replay, fresh, %d\t%.0f\t%.2f\t≥ live (%.0f)\t%s\t%.2f\t%.2f\t\n", f.Prompts, f.Rate, f.Seconds, live.Rate, met(f.Rate >= live.Rate), f.CPU.Machine, f.CPU.Bench)
	fmt.Fprintf(tw, "replay, all duplicates\t%.0f\t%.2f\t≥ %d\t%s\t%.2f\t%.2f\t\n", d.Rate, d.Seconds, goalReplayDuplicates, met(d.Rate >= goalReplayDuplicates), d.CPU.Machine, d.CPU.Bench)
	ds := r.DuplicatesSettled
	fmt.Fprintf(tw, "replay, all duplicates, after VACUUM\t%.0f\t%.2f\t≥ %d\t%s\t%.2f\t%.2f\t\n", ds.Rate, ds.Seconds, goalReplayDuplicates, met(ds.Rate >= goalReplayDuplicates), ds.CPU.Machine, ds.CPU.Bench)
	fmt.Fprintf(tw, "replay, dry run\t%.0f\t%.2f\t\t\t%.2f\t%.2f\t\n", y.Rate, y.Seconds, y.CPU.Machine, y.CPU.Bench)
	tw.Flush()
}
