package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/replay"
)

// replayOptions are the flags of `consumer replay` (docs/replay.md).
type replayOptions struct {
	brokers          []string
	topic            string
	fromOffset       string
	toOffset         string
	fromTime         string
	toTime           string
	partitions       string
	dryRun           bool
	rate             float64
	wake             bool
	asJSON           bool
	resumeFile       string
	publishRejects   bool
	maxBatch         int
	maxValueBytes    int
	bufferBytes      int
	maxRejections    int
	dbMaxConns       int32
	progressInterval time.Duration
	stopGrace        time.Duration
	topics           kafkautil.Topics
	security         kafkautil.Security
}

func newReplayCommand(o *options) *cobra.Command {
	r := &replayOptions{}
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a topic range through admission, without joining the live group or committing offsets",
		Long: `replay reads a range of a topic with a plain consumer per partition and runs
every message through admission, batched: each is admitted, a duplicate, a
conflict or malformed, never admitted twice. It commits no offset and does
not join the live consumer group.

Without --wake, replayed prompts are admitted with resume=false: their
sessions are not woken and nothing runs. --wake admits them with their own
resume flag, so their sessions run: that re-executes the prompts against the
providers. See docs/replay.md.`,
		Example: `  consumer replay --from-time 2026-03-01T00:00:00Z --to-time 2026-03-02T00:00:00Z
  consumer replay --partitions 0,3 --from-offset 0:1200,3:880 --dry-run
  consumer replay --partitions 2 --from-offset 2:4711 --to-offset 2:4712 --max-value-bytes 4194304
  consumer replay --rate 2000 --resume-file replay.json --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return r.run(cmd, o) },
	}
	f := cmd.Flags()
	f.StringSliceVar(&r.brokers, "brokers", []string{"127.0.0.1:9092"}, "Kafka bootstrap brokers, comma-separated")
	f.StringVar(&r.topic, "topic", "prompts", "topic to replay (the prompts topic, or the rejects topic to re-admit what is now valid)")
	f.StringVar(&r.fromOffset, "from-offset", "", "first offset: N for every partition, or P:N,P:N (default: the oldest)")
	f.StringVar(&r.toOffset, "to-offset", "", "end offset, exclusive: N for every partition, or P:N,P:N (default: the high-water mark at start)")
	f.StringVar(&r.fromTime, "from-time", "", "start at the first message with a timestamp at or after this RFC 3339 time")
	f.StringVar(&r.toTime, "to-time", "", "end before the first message with a timestamp at or after this RFC 3339 time")
	f.StringVar(&r.partitions, "partitions", "", "partitions to replay, e.g. 0,3,5 (default: all)")
	f.BoolVar(&r.dryRun, "dry-run", false, "classify every message without writing anything")
	f.Float64Var(&r.rate, "rate", 0, "cap on messages per second over all partitions, so replay does not starve live admission (0: no cap)")
	f.BoolVar(&r.wake, "wake", false, "admit prompts with their own resume flag, waking their sessions: RE-EXECUTES the prompts against providers")
	f.BoolVar(&r.asJSON, "json", false, "print the final report as JSON")
	f.StringVar(&r.resumeFile, "resume-file", "", "file that keeps the offsets to resume from: read at start when it exists, written at the end (also when interrupted; never by --dry-run)")
	f.BoolVar(&r.publishRejects, "publish-rejects", false, "also publish malformed and conflicting messages to the rejects topic, as the live consumer does")
	f.IntVar(&r.maxBatch, "max-batch", replay.MaxBatchDefault, "most messages of a partition admitted in one transaction")
	f.IntVar(&r.maxValueBytes, "max-value-bytes", envelope.MaxValueBytesDefault, "largest accepted prompt value in bytes (raise it to re-admit too_large prompts from their source topic; truncated rejects are never admitted)")
	f.IntVar(&r.bufferBytes, "buffer-bytes", kafkautil.BufferBytesDefault, "most bytes of fetched prompts a partition holds waiting for admission, in the Kafka client's channel, counted at --max-value-bytes each (1 to 1024 messages); replay reads every partition of its range at once, so it holds about partitions x (this + a batch of up to 16 MiB)")
	f.IntVar(&r.maxRejections, "max-rejections", replay.MaxRejectionsDefault, "rejected messages listed in the report (all are counted)")
	f.Int32Var(&r.dbMaxConns, "db-max-conns", 16, "Postgres connections (one admission transaction per partition at a time)")
	f.DurationVar(&r.progressInterval, "progress-interval", 2*time.Second, "interval of the plain progress lines (when stderr is not a terminal)")
	f.DurationVar(&r.stopGrace, "stop-grace", replay.StopGraceDefault, "how long a stop (SIGINT, SIGTERM) waits for the batches in flight (their admission, and with --publish-rejects their rejects) before it gives up on them; a second signal exits at once")
	f.StringVar(&r.topics.Prompts, "prompts-topic", "prompts", "the prompts topic (a rejects replay admits only what came from it)")
	f.StringVar(&r.topics.Wakes, "wakes-topic", "wakes", "topic of internal wakes (outbox rows of --wake)")
	f.StringVar(&r.topics.Events, "events-topic", "session-events", "topic of session events (outbox rows of input.admitted)")
	f.StringVar(&r.topics.Rejects, "rejects-topic", "prompts.rejects", "topic of rejected input")
	addSecurityFlags(f, &r.security)
	// The consumer's --partitions (and its PROMPTLINE_PARTITIONS) is a
	// partition count; here it is a list: never read from env or file.
	cliconfig.CommandLineOnly(f, "partitions")
	return cmd
}

func (r *replayOptions) validate() (replay.Bounds, error) {
	var b replay.Bounds
	var err error
	switch {
	case r.topic == "":
		return b, errors.New("--topic: must not be empty")
	case r.rate != 0 && !pacedRate(r.rate):
		return b, fmt.Errorf("--rate: must be 0 (no cap) or a finite number of messages per second, at least 1e-9, got %g", r.rate)
	case r.maxBatch < 1:
		return b, fmt.Errorf("--max-batch: must be at least 1, got %d", r.maxBatch)
	case r.maxValueBytes < 1:
		return b, fmt.Errorf("--max-value-bytes: must be at least 1, got %d", r.maxValueBytes)
	case r.bufferBytes < 1:
		return b, fmt.Errorf("--buffer-bytes: must be at least 1, got %d", r.bufferBytes)
	case r.maxRejections < 0:
		return b, fmt.Errorf("--max-rejections: must not be negative, got %d", r.maxRejections)
	case r.dbMaxConns < 2:
		return b, fmt.Errorf("--db-max-conns: must be at least 2, got %d", r.dbMaxConns)
	case r.stopGrace <= 0:
		return b, fmt.Errorf("--stop-grace: must be positive, got %s", r.stopGrace)
	case r.progressInterval <= 0:
		return b, fmt.Errorf("--progress-interval: must be positive, got %s", r.progressInterval)
	case r.dryRun && r.publishRejects:
		return b, errors.New("--dry-run and --publish-rejects exclude each other: a dry run writes nothing")
	case r.publishRejects && r.topic == r.topics.Rejects:
		return b, errors.New("--publish-rejects: replaying the rejects topic, it would publish into the topic it reads")
	case r.dryRun && r.wake:
		return b, errors.New("--dry-run and --wake exclude each other: a dry run wakes nothing")
	}
	// Empty names were defaulted by replay, so --rejects-topic "" with
	// --publish-rejects on the rejects topic published into what it read.
	if err := checkTopics([]topicFlag{
		{"--prompts-topic", r.topics.Prompts}, {"--wakes-topic", r.topics.Wakes},
		{"--events-topic", r.topics.Events}, {"--rejects-topic", r.topics.Rejects},
	}); err != nil {
		return b, err
	}
	for _, x := range r.brokers {
		if err := kafkautil.CheckBrokerAddr(x); err != nil {
			return b, err
		}
	}
	if b.From, err = replay.ParseOffsetSpec(r.fromOffset); err != nil {
		return b, fmt.Errorf("--from-offset: %w", err)
	}
	if b.To, err = replay.ParseOffsetSpec(r.toOffset); err != nil {
		return b, fmt.Errorf("--to-offset: %w", err)
	}
	if b.Partitions, err = replay.ParsePartitions(r.partitions); err != nil {
		return b, fmt.Errorf("--partitions: %w", err)
	}
	for _, t := range []struct {
		flag, s string
		dst     *time.Time
	}{{"--from-time", r.fromTime, &b.FromTime}, {"--to-time", r.toTime, &b.ToTime}} {
		if t.s == "" {
			continue
		}
		if *t.dst, err = time.Parse(time.RFC3339Nano, t.s); err != nil {
			return b, fmt.Errorf("%s: want an RFC 3339 time like 2026-03-01T12:00:00Z, got %q", t.flag, t.s)
		}
	}
	switch {
	case b.From.IsSet() && !b.FromTime.IsZero():
		return b, errors.New("--from-offset and --from-time exclude each other")
	case b.To.IsSet() && !b.ToTime.IsZero():
		return b, errors.New("--to-offset and --to-time exclude each other")
	case !b.FromTime.IsZero() && !b.ToTime.IsZero() && !b.ToTime.After(b.FromTime):
		return b, errors.New("--to-time must be after --from-time")
	}
	return b, nil
}

func (r *replayOptions) run(cmd *cobra.Command, o *options) (err error) {
	bounds, err := r.validate()
	if err != nil {
		return err
	}
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx := cmd.Context()
	// Database work outlives the stop signal long enough to finish the
	// batches in flight (--stop-grace, which the replayer bounds): the
	// signal stops reading, not writing.
	work := context.WithoutCancel(ctx)

	// An operator command: without a URL, the default server, else the
	// local cluster the consumer left, never a new one.
	db, err := pgdb.Open(work, pgdb.OpenOpts{URL: o.databaseURL, Logger: log, MaxConns: r.dbMaxConns, LocalMustExist: true})
	if err != nil {
		return err
	}
	defer db.Close()

	cfg := kafkautil.NewConfig("promptline-replay")
	// Replay reads every partition of its range at once. Sarama's channel
	// counts messages; counted at the largest value, a partition's holds
	// at most --buffer-bytes of a backlog of large prompts (1024 of them
	// took 1 GiB per partition). The whole budget goes to the channel:
	// replay has no queue after it, its batch is taken from the channel
	// (with a linger) and admitted before the next is read.
	cfg.ChannelBufferSize = kafkautil.ChannelBufferFor(r.bufferBytes, r.maxValueBytes)
	if err := r.security.Apply(cfg); err != nil {
		return err
	}
	r.security.WarnPlaintext(ctx, log, r.brokers)
	client, err := sarama.NewClient(r.brokers, cfg)
	if err != nil {
		return fmt.Errorf("connecting to Kafka at %s: %w", strings.Join(r.brokers, ","), r.security.Explain(err))
	}
	defer client.Close()

	var ranges []replay.Range
	st, resumed, err := loadResume(r.resumeFile)
	if err != nil {
		return err
	}
	if resumed {
		if cmd.Flags().Changed("topic") && st.Topic != r.topic {
			return fmt.Errorf("--resume-file %s is for topic %s, not %s", r.resumeFile, st.Topic, r.topic)
		}
		r.topic, ranges = st.Topic, st.Ranges
		if r.publishRejects && r.topic == r.topics.Rejects {
			// validate saw --topic; the file names the topic read.
			return fmt.Errorf("--publish-rejects: --resume-file %s replays the rejects topic %s; it would publish into the topic it reads", r.resumeFile, r.topic)
		}
		fmt.Fprintf(stderr, "replay: resuming %s from %s (range flags ignored)\n", r.topic, r.resumeFile)
	} else if ranges, err = replay.Resolve(client, r.topic, bounds); err != nil {
		return err
	}

	var rejects sarama.SyncProducer
	if r.publishRejects {
		if rejects, err = sarama.NewSyncProducerFromClient(client); err != nil {
			return fmt.Errorf("connecting rejects producer: %w", err)
		}
		defer rejects.Close()
	}
	maxRej := r.maxRejections
	if maxRej == 0 {
		maxRej = -1 // list none
	}
	rp, err := replay.New(db.Pool, client, rejects, &replay.Config{
		Topics: r.topics, Limits: envelope.Limits{MaxValueBytes: r.maxValueBytes}, MaxBatch: r.maxBatch,
		Rate: r.rate, Wake: r.wake, DryRun: r.dryRun, PublishRejects: r.publishRejects,
		MaxRejections: maxRej, Logger: log, MaxMessageBytes: client.Config().Producer.MaxMessageBytes,
		StopGrace: r.stopGrace,
	})
	if err != nil {
		return err
	}

	stopProgress := startProgress(stderr, rp, r.progressInterval)
	rep, runErr := rp.Run(ctx, r.topic, ranges)
	stopProgress()

	// A dry run admitted nothing: moving the resume file past what it read
	// would make the real run after it replay nothing.
	if r.resumeFile != "" && !r.dryRun {
		if err := replay.SaveResume(r.resumeFile, rep.Resume()); err != nil {
			return errors.Join(runErr, err)
		}
	}
	out := cmd.OutOrStdout()
	if r.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(out)
	}
	if err != nil {
		return errors.Join(runErr, err)
	}
	if !rep.Complete {
		next := replay.FormatOffsets(rep.NextOffsets())
		fmt.Fprintf(stderr, "replay: stopped before the end; resume from offsets %s (range ends %s)\n", next, replay.FormatOffsets(rep.EndOffsets()))
		if r.resumeFile != "" && !r.dryRun {
			fmt.Fprintf(stderr, "replay: resume state written to %s; run the command again with --resume-file %s to continue\n", r.resumeFile, r.resumeFile)
		} else {
			fmt.Fprintf(stderr, "replay: to continue: consumer replay --topic %s --from-offset %s --to-offset %s\n",
				r.topic, next, replay.FormatOffsets(rep.EndOffsets()))
		}
	}
	switch {
	case runErr != nil:
		return runErr
	case rep.Interrupted:
		return errors.New("replay interrupted")
	}
	return nil
}

func loadResume(path string) (replay.ResumeState, bool, error) {
	if path == "" {
		return replay.ResumeState{}, false, nil
	}
	return replay.LoadResume(path)
}

// startProgress draws per-partition bars on a terminal (mpb: several bars
// at once, with ETA) and a plain line every interval otherwise, until the
// returned func is called.
func startProgress(w io.Writer, rp *replay.Replayer, interval time.Duration) (stop func()) {
	term := isTerminal(w)
	if term {
		interval = 200 * time.Millisecond
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	p := &progressPrinter{w: w, start: time.Now()}
	var bars *partitionBars
	if term {
		bars = newPartitionBars(w, rp.Progress())
	}
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if bars != nil {
					bars.update(rp.Progress())
				} else {
					p.print(rp.Progress())
				}
			case <-done:
				if bars != nil {
					bars.finish(rp.Progress())
				}
				return
			}
		}
	})
	return sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
}

// partitionBars is one mpb bar per partition: messages done of the range,
// bytes read, percentage and ETA.
type partitionBars struct {
	progress  *mpb.Progress
	bars      map[int32]*mpb.Bar
	bytesRead sync.Map // partition → int64, read by the bytes decorators
}

func newPartitionBars(w io.Writer, parts []replay.PartitionReport) *partitionBars {
	pb := &partitionBars{progress: mpb.New(mpb.WithOutput(w), mpb.WithWidth(30)), bars: map[int32]*mpb.Bar{}}
	pb.update(parts)
	return pb
}

// bar returns the partition's bar, adding it the first time the partition
// shows up: the ranges are resolved by the run, after progress starts.
func (pb *partitionBars) bar(pr replay.PartitionReport) *mpb.Bar {
	if b, ok := pb.bars[pr.Partition]; ok {
		return b
	}
	part := pr.Partition
	bytes := func(decor.Statistics) string { return replay.FormatBytes(pb.bytes(part)) }
	b := pb.progress.AddBar(max(0, pr.To-pr.From),
		mpb.PrependDecorators(decor.Name(fmt.Sprintf("p%-3d ", part)), decor.CountersNoUnit("%d/%d msgs ")),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.Any(bytes, decor.WCSyncSpace),
			decor.Name(" ETA "), decor.EwmaETA(decor.ET_STYLE_GO, 30)),
	)
	pb.bars[part] = b
	return b
}

func (pb *partitionBars) bytes(p int32) int64 {
	v, _ := pb.bytesRead.Load(p)
	n, _ := v.(int64)
	return n
}

func (pb *partitionBars) update(parts []replay.PartitionReport) {
	for _, pr := range parts {
		pb.bytesRead.Store(pr.Partition, pr.Bytes)
		pb.bar(pr).EwmaSetCurrent(max(0, min(pr.Next, pr.To)-pr.From), 200*time.Millisecond)
	}
}

// finish draws the last state and stops the bars; an interrupted
// partition's bar is left where it stopped.
func (pb *partitionBars) finish(parts []replay.PartitionReport) {
	pb.update(parts)
	for _, bar := range pb.bars {
		if !bar.Completed() {
			bar.Abort(false)
		}
	}
	pb.progress.Wait()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressPrinter writes one summary line per interval, fit for logs.
type progressPrinter struct {
	w     io.Writer
	start time.Time
}

func (p *progressPrinter) print(parts []replay.PartitionReport) {
	elapsed := time.Since(p.start).Seconds()
	var total replay.Counts
	var want, done int64
	for _, pr := range parts {
		total.Messages += pr.Messages
		total.Bytes += pr.Bytes
		total.Admitted += pr.Admitted
		total.Duplicate += pr.Duplicate
		total.Conflict += pr.Conflict
		total.Malformed += pr.Malformed
		want += max(0, pr.To-pr.From)
		done += max(0, min(pr.Next, pr.To)-pr.From)
	}
	rate := float64(total.Messages) / max(elapsed, 1e-3)
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(want-done)/rate*float64(time.Second)) + time.Second/2).Truncate(time.Second).String()
	}
	fmt.Fprintf(p.w, "replay: %d/%d offsets (%d%%), %s, %.0f msgs/s, ETA %s; admitted %d, duplicate %d, conflict %d, malformed %d\n",
		done, want, pct(done, want), replay.FormatBytes(total.Bytes), rate, eta,
		total.Admitted, total.Duplicate, total.Conflict, total.Malformed)
}

func pct(n, of int64) int64 {
	if of <= 0 {
		return 100
	}
	return n * 100 / of
}
