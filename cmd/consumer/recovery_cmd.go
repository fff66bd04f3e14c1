package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/user"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// withDB opens the database for an operator command, runs fn with it and
// closes it. Operator commands inspect an existing database: without a URL,
// the default server, else the local cluster the consumer left (make demo),
// never a new one. They never change the schema: a database behind this
// binary is refused with advice to run `consumer migrate`.
func withDB(cmd *cobra.Command, o *options, fn func(db *pgdb.DB) error) error {
	log, err := operatorLogger(cmd, o)
	if err != nil {
		return err
	}
	db, err := pgdb.Open(cmd.Context(), pgdb.OpenOpts{URL: o.databaseURL, Logger: log, NoMigrate: true, LocalMustExist: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(db)
}

// operatorLogger is an operator command's logger: JSON on the command's
// stderr, at --log-level.
func operatorLogger(cmd *cobra.Command, o *options) (*slog.Logger, error) {
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})), nil
}

func newRecoverCommand(o *options) *cobra.Command {
	var policy recoveryPolicy
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Run one recovery pass now: expired claims, then lost wakes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			owner := "recover-command"
			if u, err := user.Current(); err == nil {
				owner += ":" + u.Username
			}
			// The fleet's policy (the same flags and keys as the
			// consumer's), or this pass would decide otherwise than the
			// fleet and than `recovery plan`.
			cfg, err := policy.config(owner, o.topics)
			if err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				p, err := recovery.New(db.Pool, cfg).RunOnce(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(p)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "decisions: %v; skipped (taken over elsewhere): %d; failed and quarantined: %d; failed transiently, left for the next pass: %d; sessions re-woken: %d\n",
					p.Decisions, p.Skipped, p.Failed, p.Retried, p.Redriven)
				return nil
			})
		},
	}
	policy.flags(cmd.Flags())
	outboxTopicFlags(cmd.Flags(), &o.topics)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the pass as JSON")
	return cmd
}

func newRecoveryCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "recovery", Short: "Inspect recovery decisions"}
	var asJSON bool
	explain := &cobra.Command{
		Use:   "explain SESSION",
		Short: "Print a session's recovery decisions and the evidence they rested on, and operators' resolutions, in words",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDB(cmd, o, func(db *pgdb.DB) error {
				x, err := recovery.ExplainSession(cmd.Context(), db.Pool, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					records := x.Records
					if records == nil {
						records = []recovery.Record{} // no decisions is [], not null
					}
					return json.NewEncoder(cmd.OutOrStdout()).Encode(records)
				}
				recovery.Explain(cmd.OutOrStdout(), x.Records, x.Unattached...)
				return nil
			})
		},
	}
	explain.Flags().BoolVar(&asJSON, "json", false, "print the decisions as JSON")
	cmd.AddCommand(explain, newRecoveryPlanCommand(o), newRecoveryModeCommand(o, recovery.ModeHold), newRecoveryModeCommand(o, recovery.ModeAuto),
		newRecoveryApplyCommand(o))
	return cmd
}

// recoveryPolicy is what a recovery pass decides with, for the commands
// that plan or apply as the consumers' passes do: the same flag names as
// the consumer's, so that one config file serves both.
type recoveryPolicy struct {
	batch        int
	redriveAfter time.Duration
	provider     string
	idempotent   bool
	cap          recoveryCap
}

// recoveryCap is the cap on recoveries per session, with the consumer's
// flag names (the plan and apply commands decide with it too).
type recoveryCap struct {
	max    int
	window time.Duration
}

func (c *recoveryCap) flags(f *pflag.FlagSet) {
	f.IntVar(&c.max, "recovery-max-per-session", 5, "recoveries that run a session's turn again (continued, rewoken) allowed within --recovery-max-per-session-window; one more is quarantined with reason recovery_cap instead; 0 disables the cap")
	f.DurationVar(&c.window, "recovery-max-per-session-window", recovery.MaxPerSessionWindowDefault, "the window of --recovery-max-per-session; 0 disables the cap")
}

func (c *recoveryCap) validate() error {
	switch {
	case c.max < 0:
		return fmt.Errorf("--recovery-max-per-session: must not be negative (0 disables the cap), got %d", c.max)
	case c.window < 0:
		return fmt.Errorf("--recovery-max-per-session-window: must not be negative (0 disables the cap), got %s", c.window)
	}
	return nil
}

// apply sets the cap in cfg: none when either value is 0.
func (c *recoveryCap) apply(cfg *recovery.Config) {
	if c.max > 0 && c.window > 0 {
		cfg.MaxPerSession, cfg.MaxPerSessionWindow = c.max, c.window
	}
}

func (p *recoveryPolicy) flags(f *pflag.FlagSet) {
	f.IntVar(&p.batch, "recovery-batch", recovery.BatchDefault, "expired claims and lost wakes handled, as by one pass")
	f.DurationVar(&p.redriveAfter, "redrive-after", recovery.RedriveAfterDefault, "age of a waiting input without a claim before its session is woken again")
	f.StringVar(&p.provider, "provider", "scripted", "the consumers' model provider (the name recorded on attempts)")
	f.BoolVar(&p.idempotent, "provider-honours-idempotency-keys", false, "the consumers declare that the provider deduplicates by Idempotency-Key")
	p.cap.flags(f)
}

func (p *recoveryPolicy) config(owner string, topics kafkautil.Topics) (*recovery.Config, error) {
	if p.batch < 1 {
		return nil, fmt.Errorf("--recovery-batch: must be at least 1, got %d", p.batch)
	}
	if p.redriveAfter <= 0 {
		return nil, fmt.Errorf("--redrive-after: must be positive, got %s", p.redriveAfter)
	}
	if err := p.cap.validate(); err != nil {
		return nil, err
	}
	cfg := &recovery.Config{Batch: p.batch, RedriveAfter: p.redriveAfter, OwnerID: owner, Topics: topics}
	p.cap.apply(cfg)
	if p.idempotent {
		cfg.IdempotentProviders = []string{p.provider}
	}
	return cfg, nil
}

func newRecoveryPlanCommand(o *options) *cobra.Command {
	var policy recoveryPolicy
	var session string
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Print what a recovery pass would do now, per expired claim and lost wake, with its evidence; writes nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := policy.config("recovery-plan", o.topics)
			if err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				plan, err := recovery.New(db.Pool, cfg).Plan(cmd.Context(), &recovery.PlanOpts{SessionID: session, All: all})
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(plan)
				}
				recovery.WritePlan(cmd.OutOrStdout(), plan)
				return nil
			})
		},
	}
	policy.flags(cmd.Flags())
	cmd.Flags().StringVar(&session, "session", "", "plan for this session only")
	cmd.Flags().BoolVar(&all, "all", false, "plan every expired claim and lost wake that waits, not one pass's --recovery-batch")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	return cmd
}

func newQuarantineCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "quarantine", Short: "List and release quarantined rows"}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List quarantined rows with their reasons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, o, func(db *pgdb.DB) error {
				rows, err := recovery.ListQuarantined(cmd.Context(), db.Pool)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(rows)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "KIND\tID\tSESSION\tQUARANTINED\tREASON")
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Kind, r.ID, r.SessionID, r.QuarantinedAt.UTC().Format(time.RFC3339), r.Reason)
				}
				return w.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the rows as JSON")
	cmd.AddCommand(list, newQuarantineReleaseCommand(o))
	return cmd
}

// newQuarantineReleaseCommand is `quarantine release KIND ID`, and its bulk
// form `quarantine release KIND --all --reason-contains TEXT` (or
// --any-reason): the same audited release, row by row.
func newQuarantineReleaseCommand(o *options) *cobra.Command {
	var operator, note, reasonContains string
	var all, anyReason, dryRun, asJSON bool
	release := &cobra.Command{
		Use:   "release KIND ID | KIND --all (--reason-contains TEXT | --any-reason)",
		Short: "Release a repaired row (KIND: claim, with the session ID; input, with the message ID; outbox, with the row ID), or with --all every quarantined row of KIND whose reason matches; audited",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if !all {
				for _, name := range []string{"reason-contains", "any-reason", "dry-run", "json"} {
					if f.Changed(name) {
						return fmt.Errorf("--%s: only with --all (a bulk release); a single release takes KIND and ID", name)
					}
				}
				if len(args) != 2 {
					return errors.New("quarantine release: needs KIND and ID, or KIND and --all to release many rows")
				}
			} else {
				if len(args) != 1 {
					return fmt.Errorf("--all: takes KIND only, not an ID (got %q): it releases every matching row of KIND", args[1])
				}
				switch {
				case anyReason && f.Changed("reason-contains"):
					return errors.New("--any-reason: not with --reason-contains; say one")
				case anyReason:
				case !f.Changed("reason-contains"):
					return errors.New("--all: needs --reason-contains TEXT (the rows' reason must contain it), or --any-reason to release every quarantined row of KIND")
				case reasonContains == "":
					return errors.New("--reason-contains: must not be empty (it would match every reason); use --any-reason to release every quarantined row of KIND")
				}
			}
			operator, err := operatorOr(operator, "releases the row")
			if err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				if all {
					return releaseMatching(cmd, db, &recovery.BulkReleaseOpts{Kind: args[0], ReasonContains: reasonContains,
						DryRun: dryRun, Operator: operator, Note: note, Topics: o.topics}, asJSON)
				}
				if err := recovery.Release(cmd.Context(), db.Pool, args[0], args[1], &recovery.ReleaseOpts{Operator: operator, Note: note, Topics: o.topics}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "released %s %s\n", args[0], args[1])
				return nil
			})
		},
	}
	f := release.Flags()
	f.StringVar(&operator, "operator", "", "who releases the row (default: the OS user), recorded in the audit")
	f.StringVar(&note, "note", "", "what was repaired, recorded in the audit")
	f.BoolVar(&all, "all", false, "release every quarantined row of KIND that --reason-contains selects (or --any-reason), one by one, each audited; exit 1 when a claim is refused")
	f.StringVar(&reasonContains, "reason-contains", "", "with --all: release the rows whose reason contains this text, as written (no pattern, case counts; not empty)")
	f.BoolVar(&anyReason, "any-reason", false, "with --all: release every quarantined row of KIND, whatever its reason")
	f.BoolVar(&dryRun, "dry-run", false, "with --all: list the rows that would be released; write nothing")
	f.BoolVar(&asJSON, "json", false, "with --all: print a JSON object per row, then one with the summary")
	// A bulk release is said on the command line, each time: a fleet's
	// config file or environment (where `all` serves recovery plan, and
	// dry-run replay) must never widen a release.
	for _, name := range []string{"all", "reason-contains", "any-reason", "dry-run", "json"} {
		cliconfig.CommandLineOnly(f, name)
	}
	outboxTopicFlags(f, &o.topics)
	return release
}

// releaseMatching runs a bulk release and prints a line per row as it
// goes, then the summary; an error when a row was refused or the release
// stopped (an interrupt: what was released stays released and audited).
func releaseMatching(cmd *cobra.Command, db *pgdb.DB, opts *recovery.BulkReleaseOpts, asJSON bool) error {
	out := cmd.OutOrStdout()
	enc := json.NewEncoder(out)
	var refused []recovery.BulkReleaseRow
	sum, err := recovery.ReleaseMatching(cmd.Context(), db.Pool, opts, func(r recovery.BulkReleaseRow) error {
		if r.Outcome == recovery.OutcomeRefused {
			refused = append(refused, r)
		}
		if asJSON {
			return enc.Encode(r)
		}
		var werr error
		switch r.Outcome {
		case recovery.OutcomeWouldRelease:
			_, werr = fmt.Fprintf(out, "would release %s %s (%s)\n", r.Kind, r.ID, r.Reason)
		case recovery.OutcomeReleased:
			_, werr = fmt.Fprintf(out, "released %s %s (%s)\n", r.Kind, r.ID, r.Reason)
		default:
			_, werr = fmt.Fprintf(out, "%s %s %s: %s\n", r.Outcome, r.Kind, r.ID, r.Detail)
		}
		return werr
	})
	if asJSON {
		if jerr := enc.Encode(struct {
			Summary recovery.BulkReleaseSummary `json:"summary"`
		}{sum}); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		if opts.DryRun {
			fmt.Fprintf(out, "would release %d (dry run: nothing written)\n", sum.WouldRelease)
		} else {
			fmt.Fprintf(out, "released %d, refused %d, skipped %d\n", sum.Released, sum.Refused, sum.Skipped)
		}
		for _, r := range refused {
			fmt.Fprintf(out, "  refused %s %s: %s\n", r.Kind, r.ID, r.Detail)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("bulk release stopped after releasing %d rows (each audited); run it again to release the rest: %w", sum.Released, err)
	case sum.Refused > 0:
		return fmt.Errorf("%d of %d rows refused (they still fail validation); repair them, then release them", sum.Refused, sum.Released+sum.Refused+sum.Skipped)
	}
	return nil
}

// operatorOr names the operator: the flag, else the OS user.
func operatorOr(operator, what string) (string, error) {
	if operator == "" {
		if u, err := user.Current(); err == nil {
			operator = u.Username
		}
	}
	if operator == "" {
		return "", fmt.Errorf("--operator: must name who %s", what)
	}
	return operator, nil
}

// newRecoveryModeCommand is `recovery hold` (mode hold) or `recovery
// resume` (mode auto).
func newRecoveryModeCommand(o *options, mode string) *cobra.Command {
	var operator, note string
	use, short := "resume", "Return every consumer's recovery passes to acting (auto) within one pass; audited"
	if mode == recovery.ModeHold {
		use, short = "hold", "Make every consumer's recovery passes only plan, within one pass, until resume; audited"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			operator, err := operatorOr(operator, "sets the recovery mode")
			if err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				if err := recovery.SetMode(cmd.Context(), db.Pool, mode, operator, note); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "recovery mode: %s (set by %s)\n", mode, operator)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&operator, "operator", "", "who sets the mode (default: the OS user), recorded in the audit")
	cmd.Flags().StringVar(&note, "note", "", "why, recorded in the audit")
	return cmd
}

func newRecoveryApplyCommand(o *options) *cobra.Command {
	var policy recoveryPolicy
	var opts recovery.ApplyOpts
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Apply what a recovery pass would do now (as `recovery plan` shows), at a bounded rate, in any mode; audited, resumable",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Operator, err = operatorOr(opts.Operator, "applies"); err != nil {
				return err
			}
			if !pacedRate(opts.Rate) {
				return fmt.Errorf("--rate: must be a finite number of decisions per second, at least 1e-9, got %g", opts.Rate)
			}
			if opts.Max < 0 {
				return fmt.Errorf("--max: must not be negative, got %d", opts.Max)
			}
			switch opts.Decision {
			case "", recovery.DecisionCleared, recovery.DecisionSuperseded, recovery.DecisionRewoken, recovery.DecisionContinued,
				recovery.DecisionReconciled, recovery.DecisionQuarantined, recovery.DecisionRedriven:
			default:
				return fmt.Errorf("--decision: unknown decision %q", opts.Decision)
			}
			cfg, err := policy.config("", o.topics)
			if err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				rec := recovery.New(db.Pool, cfg)
				term := isTerminal(cmd.ErrOrStderr())
				var total int
				if term {
					// The bar's length: what waits of what is asked for,
					// counted once (a line per item needs no total).
					waiting, err := rec.Waiting(cmd.Context(), &recovery.PlanOpts{SessionID: opts.SessionID})
					if err != nil {
						return err
					}
					for d, n := range waiting {
						if opts.Decision == "" || d == opts.Decision {
							total += n
						}
					}
				}
				progress := newApplyProgress(cmd.ErrOrStderr(), term, total, opts.Max)
				opts.OnProgressFunc = progress.applied
				res, err := rec.Apply(cmd.Context(), &opts)
				progress.finish()
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "apply #%d: decisions: %v; skipped (changed since planned, or handled elsewhere): %d; left after a transient error (run again): %d; failed decisions: %d\n",
					res.ID, res.Decisions, res.Skipped, res.Retried, res.Failed)
				return nil
			})
		},
	}
	policy.flags(cmd.Flags())
	outboxTopicFlags(cmd.Flags(), &o.topics)
	cmd.Flags().StringVar(&opts.SessionID, "session", "", "apply to this session only")
	cmd.Flags().StringVar((*string)(&opts.Decision), "decision", "", "apply only what a pass decides so (cleared, superseded, rewoken, continued, reconciled, quarantined; redriven for lost wakes)")
	cmd.Flags().Float64Var(&opts.Rate, "rate", 10, "most decisions applied per second")
	cmd.Flags().IntVar(&opts.Max, "max", 0, "most decisions applied by this run; 0: no bound")
	cmd.Flags().StringVar(&opts.Operator, "operator", "", "who applies (default: the OS user), recorded in the audit and in each decision's recovered_by")
	cmd.Flags().StringVar(&opts.Note, "note", "", "why, recorded in the audit")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// applyProgress shows an apply's progress: on a terminal an mpb bar (the
// items applied of those that waited when the run began, the rate and the
// ETA, the last item), otherwise a line per item, fit for logs.
type applyProgress struct {
	w        io.Writer
	max      int
	progress *mpb.Progress
	bar      *mpb.Bar
	total    int64        // the bar's shown total
	last     atomic.Value // string, read by the bar's decorator
}

// newApplyProgress draws a bar of total items (at most max when max > 0)
// when term, else lines.
func newApplyProgress(w io.Writer, term bool, total, max int) *applyProgress {
	p := &applyProgress{w: w, max: max}
	p.last.Store("")
	if !term {
		return p
	}
	if max > 0 {
		total = min(total, max)
	}
	// term was decided by the caller: render even when mpb cannot tell.
	p.progress = mpb.New(mpb.WithOutput(w), mpb.WithWidth(30), mpb.WithAutoRefresh())
	// Built with no total, the bar ends only at finish (a claim that
	// expires during the run must not find it completed); the count is
	// the total it shows.
	p.total = int64(total)
	p.bar = p.progress.AddBar(0,
		mpb.PrependDecorators(decor.Name("applied "), decor.CountersNoUnit("%d/%d ")),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.Name(" ETA "), decor.EwmaETA(decor.ET_STYLE_GO, 30),
			decor.Any(func(decor.Statistics) string { return "  " + p.last.Load().(string) })),
	)
	p.bar.SetTotal(p.total, false)
	return p
}

// applied is recovery.ApplyOpts.OnProgressFunc.
func (p *applyProgress) applied(n int, last string) {
	if p.bar == nil {
		bound := "…"
		if p.max > 0 {
			bound = fmt.Sprintf("/%d", p.max)
		}
		fmt.Fprintf(p.w, "applied %d%s  %s\n", n, bound, last)
		return
	}
	p.last.Store(last)
	if int64(n) > p.total {
		// Claims that expired since the count lengthen the bar.
		p.total = int64(n)
		p.bar.SetTotal(p.total, false)
	}
	p.bar.SetCurrent(int64(n))
}

// finish draws the last state and ends the bar where the run ended: what
// changed since it was counted, or was handled elsewhere, is not waited for.
func (p *applyProgress) finish() {
	if p.bar == nil {
		return
	}
	p.bar.SetTotal(-1, true)
	p.progress.Wait()
}
