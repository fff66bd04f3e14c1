package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// options are the consumer's flags: a public contract (README "Flags").
type options struct {
	brokers           []string
	embeddedKafkaAddr string
	databaseURL       string
	metricsAddr       string
	group             string
	logLevel          string
	partitions        int32
	createTopics      bool
	maxSessions       int
	maxBatch          int
	localWakes        bool
	maxValueBytes     int
	bufferBytes       int
	maxMessageBytes   int
	shutdownGrace     time.Duration
	toolTimeout       time.Duration
	lease             time.Duration
	recoveryInterval  time.Duration
	recoveryBatch     int
	redriveAfter      time.Duration
	recoveryMode      string
	recoveryCap       recoveryCap
	recoveryRate      float64
	outboxRetention   time.Duration
	ledgerRetention   time.Duration
	dbMaxConns        int32
	dbTimeouts        [3]time.Duration // statement, lock, idle in transaction
	dbRoundTrip       time.Duration    // 0: the statement timeout plus pgdb.RoundTripMargin
	migrate           bool             // apply migrations at start; false: only check the schema version
	provider          providerOptions
	permissionFlags   []string
	permissions       permissionPolicy
	topics            kafkautil.Topics
	replicationFactor int16
	security          kafkautil.Security
	config            string // the config file (README "Configuration")
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "PROMPTLINE_"

func newRootCommand() *cobra.Command { return newRootCommandEnv(os.Environ) }

// newRootCommandEnv builds the command tree reading its environment
// settings from environ, so that tests pass theirs and run in parallel.
func newRootCommandEnv(environ func() []string) *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:           "consumer",
		Short:         "Run promptline: admit prompts from Kafka, execute sessions, publish their events",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := root.Flags()
	f.StringSliceVar(&o.brokers, "brokers", nil, "Kafka bootstrap brokers, comma-separated; empty starts the embedded broker")
	f.StringVar(&o.embeddedKafkaAddr, "embedded-kafka-addr", "127.0.0.1:9092", "listen address of the embedded broker (when --brokers is empty)")
	pf := root.PersistentFlags()
	pf.StringVar(&o.config, "config", "", "YAML file of settings, keys = flag names (README \"Configuration\"); precedence: flag > env PROMPTLINE_<FLAG> > file > default")
	pf.StringVar(&o.databaseURL, "database-url", "", "Postgres URL (env PROMPTLINE_DATABASE_URL, else DATABASE_URL); empty: the local server on 127.0.0.1:5432, else the local cluster kept in the temp directory")
	f.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address serving /metrics and /healthz")
	f.StringVar(&o.group, "group", "promptline", "Kafka consumer group")
	pf.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.DurationVar(&o.recoveryInterval, "recovery-interval", recovery.IntervalDefault, "time between recovery passes")
	f.IntVar(&o.recoveryBatch, "recovery-batch", recovery.BatchDefault, "expired claims and lost wakes handled per recovery pass")
	f.StringVar(&o.recoveryMode, "recovery-mode", "auto", "auto: recovery passes act; hold: they only plan, and an operator applies (consumer recovery apply); the fleet-wide mode set by consumer recovery hold|resume wins over this flag")
	o.recoveryCap.flags(f)
	f.Float64Var(&o.recoveryRate, "recovery-rate", 0, "most recovery decisions per second that wake a session (continuations, re-armed ready claims, re-wakes of lost wakes), across the whole fleet (a token bucket in Postgres, docs/runbook.md); what a pass cannot pace in one --recovery-interval is left for the next; 0: unbounded")
	f.DurationVar(&o.outboxRetention, "outbox-retention", time.Hour, "how long published outbox rows are kept before they are deleted (Kafka keeps what was published); 0 keeps them forever")
	f.DurationVar(&o.ledgerRetention, "ledger-retention", 7*24*time.Hour, "how long the ledger rows (provider attempts, tool calls) of a settled execution of an idle session are kept before they are deleted; rows recovery may still need are never deleted; 0 keeps them forever")
	f.DurationVar(&o.redriveAfter, "redrive-after", recovery.RedriveAfterDefault, "age of a waiting input without a claim before its session is woken again")
	f.Int32Var(&o.partitions, "partitions", 16, "partitions of topics created at start")
	f.BoolVar(&o.createTopics, "create-topics", true, "create missing topics at start (with --partitions and --replication-factor)")
	f.Int16Var(&o.replicationFactor, "replication-factor", 1, "replication factor of topics created at start (3 on a production cluster)")
	addSecurityFlags(f, &o.security)
	f.IntVar(&o.maxSessions, "max-sessions", 256, "sessions executing at once in this process")
	f.IntVar(&o.maxBatch, "max-batch", 500, "most prompts admitted in one transaction")
	f.BoolVar(&o.localWakes, "local-wakes", true, "start a session at once when a prompt admitted here belongs to a wakes partition this process owns (its wake, arriving from Kafka, then waits for that run)")
	f.IntVar(&o.maxValueBytes, "max-value-bytes", envelope.MaxValueBytesDefault, "largest accepted prompt value in bytes")
	f.IntVar(&o.bufferBytes, "buffer-bytes", kafkautil.BufferBytesDefault, "most bytes of fetched prompts a partition holds before and during their admission: half in the Kafka client's channel, counted at --max-value-bytes each (1 to 1024 messages), half in admission's queue, counted at their real sizes; bounds the memory a backlog of large prompts takes")
	f.IntVar(&o.maxMessageBytes, "max-message-bytes", kafkautil.MaxMessageBytesDefault, "largest message the Kafka producer sends (rejects, events, wakes); every topic's max.message.bytes must be at least 61 bytes more (a record batch's header); a larger reject is published truncated")
	f.StringVar(&o.provider.kind, "provider", "scripted", "model provider: scripted (no model; demos and tests), http, openai")
	f.StringVar(&o.provider.url, "provider-url", "", "URL the http provider POSTs turns to (docs/providers.md)")
	f.BoolVar(&o.provider.idempotent, "provider-honours-idempotency-keys", false, "declare that the provider deduplicates by Idempotency-Key: uncertain attempts are then sent again with the same key")
	f.StringVar(&o.provider.openaiBase, "openai-base-url", "https://api.openai.com/v1", "base URL of an OpenAI-compatible Chat Completions API")
	f.StringVar(&o.provider.openaiModel, "openai-model", "", "model name for the openai provider")
	f.StringVar(&o.provider.openaiKeyEnv, "openai-api-key-env", "OPENAI_API_KEY", "environment variable holding the API key (never logged)")
	f.StringVar(&o.provider.openaiKeyFile, "openai-api-key-file", "", "file holding the API key (takes precedence over the environment variable)")
	f.BoolVar(&o.provider.openaiStream, "openai-stream", false, "ask the openai provider to stream its answers; their text goes out as live deltas on --deltas-topic (not durable; the answer is committed at the end of each step as always)")
	f.StringVar(&o.topics.Deltas, "deltas-topic", "session-deltas", "topic of live text deltas of streaming providers (not durable)")
	f.StringArrayVar(&o.provider.httpEndpoints, "http-tool-endpoint", nil, "an endpoint of the http_request tool: name=N,url=U[,method=POST][,class=side_effecting|idempotent] (repeatable; the model names endpoints, never URLs; class defaults to side_effecting)")
	f.StringArrayVar(&o.provider.mcpServers, "mcp-server", nil, `an MCP server whose tools the model may call, as SERVER__TOOL: name=N,command="CMD ARGS" (stdio, run without a shell) or name=N,url=U (streamable HTTP) (repeatable; docs/tools.md)`)
	// Their items hold commas: one item per line from the environment.
	cliconfig.ItemsPerLine(f, "http-tool-endpoint")
	cliconfig.ItemsPerLine(f, "mcp-server")
	f.StringArrayVar(&o.provider.toolClasses, "tool-class", nil, "class of an MCP tool SERVER.TOOL=side_effecting|idempotent (repeatable); stricter than its annotations at will, looser only as idempotent! (docs/tools.md)")
	f.StringVar(&o.provider.sandboxDir, "sandbox-dir", "", "directory the append_line demo tool writes in (scripted provider); empty: a temporary directory")
	f.StringArrayVar(&o.permissionFlags, "tool-permission", nil, "tool policy NAME=allow|deny|ask (repeatable); ask parks the session until a reply on the permission-replies topic; tools default to allow")
	f.StringVar(&o.topics.PermissionReplies, "permission-replies-topic", "permission-replies", "topic of replies to permission requests")
	f.DurationVar(&o.dbTimeouts[0], "db-statement-timeout", pgdb.StatementTimeoutDefault, "Postgres statement_timeout of every connection")
	f.DurationVar(&o.dbTimeouts[1], "db-lock-timeout", pgdb.LockTimeoutDefault, "Postgres lock_timeout of every connection")
	f.DurationVar(&o.dbTimeouts[2], "db-idle-in-transaction-timeout", pgdb.IdleInTxTimeoutDefault, "Postgres idle_in_transaction_session_timeout: a paused process cannot hold locks longer")
	f.DurationVar(&o.dbRoundTrip, "db-round-trip-timeout", 0, "longest wait for Postgres's answer that has no deadline of its own (a group commit, a renewal, a relay pass, a pool ping), and the connections' TCP user timeout: a silent partition or failover then costs this long, not the kernel's 15 minutes; past it the connection is closed and the write is handled as after a lost connection; never shorter than --lease; 0: --db-statement-timeout plus 5s, or --lease when longer")
	f.BoolVar(&o.migrate, "migrate", true, "apply pending migrations at start (each statement under a 15-minute timeout, or --db-statement-timeout if longer); false: only check the schema version (the runtime role has no DDL rights; run consumer migrate as the owner)")
	f.Int32Var(&o.dbMaxConns, "db-max-conns", 32, "Postgres connections in this process's pool (admission per partition, executions, relay)")
	f.DurationVar(&o.lease, "lease", ledger.LeaseDefault, "claim lease; a live execution renews it once lease/3 has passed since its last write (every write renews it too), by the database clock")
	f.DurationVar(&o.shutdownGrace, "shutdown-grace", executor.StopGraceDefault, "time running turns get to finish on SIGTERM")
	f.DurationVar(&o.toolTimeout, "tool-timeout", 30*time.Second, "bound of one tool call: past it the call's outcome is unknown (never re-run automatically) and the turn goes on")
	f.StringVar(&o.topics.Prompts, "prompts-topic", "prompts", "topic of incoming prompts")
	outboxTopicFlags(f, &o.topics)
	f.StringVar(&o.topics.Rejects, "rejects-topic", "prompts.rejects", "topic of rejected input")
	root.AddCommand(newBrokerCommand(), newRecoverCommand(o), newRecoveryCommand(o), newQuarantineCommand(o), newSessionCommand(o), newMigrateCommand(o), newReplayCommand(o), newConsoleCommand(o))
	loader := cliconfig.New(&cliconfig.Config{
		EnvPrefix:   envPrefix,
		EnvironFunc: environ,
		// DATABASE_URL stays accepted, below PROMPTLINE_DATABASE_URL.
		EnvAliases: map[string]string{"DATABASE_URL": "database-url"},
		// The crash-point switch of fault builds (internal/faults) and the
		// tests' broker switch, not settings.
		IgnoreEnv: slices.Concat(faults.EnvVars, kafkautil.TestEnvVars),
		// The producer's settings in a shared environment are not typos.
		Program: "consumer",
	})
	root.AddCommand(newConfigCommand(root, loader, o.validate))
	failUnknownSubcommands(root)
	loader.Install(root)
	return root
}

// failUnknownSubcommands makes every command that only groups others
// (recovery, quarantine, session, config) refuse a subcommand it does not
// have, as cobra makes the root do. Cobra leaves a group without a Run
// alone: `consumer recovery hodl` printed the help and exited 0, and a
// script took it for done.
func failUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		failUnknownSubcommands(sub)
	}
	if !c.HasParent() || c.Runnable() || !c.HasSubCommands() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.SuggestionsMinimumDistance = 2 // the root's default: hodl finds hold
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
			msg += "; did you mean " + strings.Join(suggestions, " or ") + "?"
		}
		return errors.New(msg)
	}
}

// addSecurityFlags adds the Kafka TLS and SASL flags (kafkautil.Security
// names them in its errors) to every command that talks to Kafka.
func addSecurityFlags(f *pflag.FlagSet, s *kafkautil.Security) {
	f.BoolVar(&s.TLS, "tls", false, "connect to Kafka with TLS (certificates are always verified)")
	f.StringVar(&s.CAFile, "tls-ca-file", "", "PEM file of CA certificates trusted for the brokers, added to the system's")
	f.StringVar(&s.CertFile, "tls-cert-file", "", "PEM client certificate (mutual TLS), with --tls-key-file")
	f.StringVar(&s.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	f.StringVar(&s.ServerName, "tls-server-name", "", "name verified in the brokers' certificates (default: the host of each broker address)")
	f.StringVar(&s.SASLMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (empty: no SASL)")
	f.StringVar(&s.SASLUser, "sasl-user", "", "SASL user (PLAIN, SCRAM)")
	f.StringVar(&s.SASLPasswordFile, "sasl-password-file", "", "file holding the SASL password (PLAIN, SCRAM); a file keeps it out of flags, env dumps and logs")
	f.StringVar(&s.SASLTokenFile, "sasl-token-file", "", "file holding the OAUTHBEARER token, read again at each connection (rotation)")
}

// newConfigCommand is `consumer config print`: the effective
// configuration of the consumer, each value with its source.
func newConfigCommand(root *cobra.Command, loader *cliconfig.Loader, validate func() error) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Show the effective configuration"}
	printCmd := &cobra.Command{
		Use:   "print",
		Short: "Print every setting of the consumer with its source (default, config file, env, flag) as YAML, secrets redacted",
		Long: `print resolves the consumer's settings as ` + "`consumer`" + ` itself would (flag >
env PROMPTLINE_<FLAG> > config file > default) and prints each value with its
source. It accepts the consumer's flags, so a command line can be checked too:
after the settings it checks them as the consumer does, and exits 1 with the
consumer's error when the consumer would refuse them.
Secrets are redacted: URL passwords, and values of settings named like a
password, token or secret (files are shown as paths; their contents are never
printed).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			settings, err := loader.Effective()
			if err != nil {
				return err
			}
			if err := cliconfig.WriteYAML(cmd.OutOrStdout(), settings); err != nil {
				return err
			}
			return validate()
		},
	}
	// The consumer's own flags, shared: parsing them here sets the same values.
	printCmd.Flags().AddFlagSet(root.LocalNonPersistentFlags())
	cmd.AddCommand(printCmd)
	return cmd
}

func (o *options) validate() error {
	if err := o.recoveryCap.validate(); err != nil {
		return err
	}
	switch {
	case o.partitions < 1:
		return fmt.Errorf("--partitions: must be at least 1, got %d", o.partitions)
	case o.maxSessions < 1:
		return fmt.Errorf("--max-sessions: must be at least 1, got %d", o.maxSessions)
	case o.dbMaxConns < 2:
		return fmt.Errorf("--db-max-conns: must be at least 2, got %d", o.dbMaxConns)
	case o.dbTimeouts[0] < time.Second || o.dbTimeouts[1] < 100*time.Millisecond || o.dbTimeouts[2] < time.Second:
		return fmt.Errorf("--db-statement-timeout (≥1s), --db-lock-timeout (≥100ms), --db-idle-in-transaction-timeout (≥1s): got %s, %s, %s",
			o.dbTimeouts[0], o.dbTimeouts[1], o.dbTimeouts[2])
	case o.dbRoundTrip != 0 && o.dbRoundTrip < time.Second:
		return fmt.Errorf("--db-round-trip-timeout: must be 0 (--db-statement-timeout plus 5s) or at least 1s, got %s", o.dbRoundTrip)
	case o.dbRoundTrip != 0 && o.dbRoundTrip < o.lease:
		return fmt.Errorf("--db-round-trip-timeout: must not be shorter than --lease (%s), got %s: a write given up while its lease lives would be retried while it may still land", o.lease, o.dbRoundTrip)
	case o.maxBatch < 1:
		return fmt.Errorf("--max-batch: must be at least 1, got %d", o.maxBatch)
	case o.maxValueBytes < 1:
		return fmt.Errorf("--max-value-bytes: must be at least 1, got %d", o.maxValueBytes)
	case o.bufferBytes < 1:
		return fmt.Errorf("--buffer-bytes: must be at least 1, got %d", o.bufferBytes)
	case o.maxMessageBytes < minMessageBytes || o.maxMessageBytes >= int(sarama.MaxRequestSize):
		return fmt.Errorf("--max-message-bytes: must be from %d to %d, got %d", minMessageBytes, sarama.MaxRequestSize-1, o.maxMessageBytes)
	case o.lease < 300*time.Millisecond:
		return fmt.Errorf("--lease: must be at least 300ms, got %s", o.lease)
	case o.recoveryInterval < 100*time.Millisecond:
		return fmt.Errorf("--recovery-interval: must be at least 100ms, got %s", o.recoveryInterval)
	case o.recoveryMode != recovery.ModeAuto && o.recoveryMode != recovery.ModeHold:
		return fmt.Errorf("--recovery-mode: must be auto or hold, got %q", o.recoveryMode)
	case math.IsNaN(o.recoveryRate) || math.IsInf(o.recoveryRate, 0) || o.recoveryRate < 0:
		return fmt.Errorf("--recovery-rate: must be 0 (unbounded) or a positive number of decisions per second, got %g", o.recoveryRate)
	case o.recoveryBatch < 1:
		return fmt.Errorf("--recovery-batch: must be at least 1, got %d", o.recoveryBatch)
	case o.outboxRetention != 0 && o.outboxRetention < time.Second:
		return fmt.Errorf("--outbox-retention: must be 0 (keep forever) or at least 1s, got %s", o.outboxRetention)
	case o.ledgerRetention != 0 && o.ledgerRetention < time.Second:
		return fmt.Errorf("--ledger-retention: must be 0 (keep forever) or at least 1s, got %s", o.ledgerRetention)
	case o.redriveAfter <= 0:
		return fmt.Errorf("--redrive-after: must be positive, got %s", o.redriveAfter)
	case o.shutdownGrace < 0:
		return fmt.Errorf("--shutdown-grace: must not be negative, got %s", o.shutdownGrace)
	case o.toolTimeout <= 0:
		return fmt.Errorf("--tool-timeout: must be positive, got %s", o.toolTimeout)
	case o.group == "":
		return fmt.Errorf("--group: must not be empty")
	case o.replicationFactor < 1:
		return fmt.Errorf("--replication-factor: must be at least 1, got %d", o.replicationFactor)
	case len(o.brokers) == 0 && (o.security != kafkautil.Security{}):
		return errors.New("--tls, --sasl-mechanism: need --brokers (the embedded broker speaks plaintext)")
	}
	if err := o.security.Apply(kafkautil.NewConfig("validate")); err != nil {
		return err
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return err
	}
	if err := o.provider.validate(); err != nil {
		return err
	}
	perms, err := parsePermissions(o.permissionFlags)
	if err != nil {
		return err
	}
	o.permissions = perms
	if err := checkTopics([]topicFlag{
		{"--prompts-topic", o.topics.Prompts}, {"--wakes-topic", o.topics.Wakes}, {"--events-topic", o.topics.Events},
		{"--rejects-topic", o.topics.Rejects}, {"--permission-replies-topic", o.topics.PermissionReplies},
		{"--deltas-topic", o.topics.Deltas},
	}); err != nil {
		return err
	}
	for _, b := range o.brokers {
		if err := kafkautil.CheckBrokerAddr(b); err != nil {
			return err
		}
	}
	// An empty address would listen on every interface at a random port.
	if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
		return fmt.Errorf("--metrics-addr: %q is not host:port", o.metricsAddr)
	}
	return nil
}

// minMessageBytes is the smallest --max-message-bytes: room for a
// truncated reject's headers, and for the events and wakes the relay sends.
const minMessageBytes = 4096

// pacedRate reports whether rate (per second) paces anything: a finite
// number not below minRate. A NaN, an infinity or a rate whose interval
// (one second over it) overflows a time.Duration is converted to a
// negative or zero interval, which paces nothing: the command would run
// at full speed where the operator asked for a bound.
func pacedRate(rate float64) bool { return rate >= minRate && !math.IsInf(rate, 0) }

// minRate is the smallest rate a command paces by, one per 31 years: far
// below any an operator means, and far above the one whose interval
// overflows a time.Duration (one per 292 years).
const minRate = 1e-9

// parseLevel reads --log-level: one of the four documented names, in any
// case. slog's own syntax ("warn+3", "info-4") is not accepted: a level
// between them would hide the lines the docs say each level shows.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level: want debug, info, warn or error, got %q", s)
}

func newBrokerCommand() *cobra.Command {
	var addr, dataDir string
	var partitions int32
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Run the embedded Kafka-protocol broker alone (so consumers can be killed while it lives)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if partitions < 1 {
				return fmt.Errorf("--partitions: must be at least 1, got %d", partitions)
			}
			b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{
				Addr: addr, DataDir: dataDir, Partitions: partitions, Topics: kafkautil.Topics{}.WithDefaults().All(),
			})
			if err != nil {
				return err
			}
			defer b.Close()
			slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil)).Info("embedded broker ready",
				slog.String("addr", b.Addr()), slog.String("data_dir", dataDir))
			<-cmd.Context().Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9092", "listen address")
	// The console's --addr (and PROMPTLINE_ADDR, a config file's addr) is
	// the console's listen address; the broker's is the command line's.
	cliconfig.CommandLineOnly(cmd.Flags(), "addr")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory that keeps topics across restarts (empty: in memory)")
	cmd.Flags().Int32Var(&partitions, "partitions", 16, "partitions of the promptline topics it creates")
	return cmd
}

// outboxTopicFlags adds the flags of the topics outbox rows go to (wakes
// and session events), with the same names on the consumer and on every
// operator command that writes such rows (recover, recovery apply,
// quarantine release, session resolve, console): one config file or
// environment serves the fleet and its operators, whose events and wakes
// must reach the topics the fleet reads.
func outboxTopicFlags(f *pflag.FlagSet, t *kafkautil.Topics) {
	f.StringVar(&t.Wakes, "wakes-topic", "wakes", "topic of internal wakes")
	f.StringVar(&t.Events, "events-topic", "session-events", "topic of outgoing session events")
}

// topicFlag is a topic flag and its value.
type topicFlag struct{ flag, name string }

// checkTopics refuses an empty topic name, and one topic for two kinds of
// message: rejects published into the prompts topic would be read back
// as prompts and rejected again, for ever; wakes or replies there would
// each be rejected.
func checkTopics(topics []topicFlag) error {
	flagOf := map[string]string{}
	for _, t := range topics {
		if t.name == "" {
			return fmt.Errorf("%s: must not be empty", t.flag)
		}
		if other, ok := flagOf[t.name]; ok {
			return fmt.Errorf("%s: %q is also %s; each topic carries one kind of message", t.flag, t.name, other)
		}
		flagOf[t.name] = t.flag
	}
	return nil
}
