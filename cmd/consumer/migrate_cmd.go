package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/pgdb"
)

// newMigrateCommand is `consumer migrate`: apply the embedded migrations
// with the schema owner role and exit, so that the consumers can run with
// a role that has no DDL rights (--migrate=false; docs/deploy.md).
func newMigrateCommand(o *options) *cobra.Command {
	var stmtTimeout, lockTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the database migrations and exit (run it as the schema owner role)",
		Long: "Apply the embedded, forward-only migrations under an advisory lock and exit. " +
			"Run it as the role that owns the schema (deployments/postgres/roles.sql) before starting " +
			"consumers with --migrate=false as the runtime role. A database migrated by a newer release is refused.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level, err := parseLevel(o.logLevel)
			if err != nil {
				return err
			}
			if stmtTimeout < time.Second || lockTimeout < 100*time.Millisecond {
				return fmt.Errorf("--db-statement-timeout (≥1s), --db-lock-timeout (≥100ms): got %s, %s", stmtTimeout, lockTimeout)
			}
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			// Without a URL, the default server, else the local cluster
			// the consumer left (make demo), whose older schema a newer
			// console refuses with advice to run this command; never a
			// new one, which would be pointless to migrate.
			db, err := pgdb.Open(cmd.Context(), pgdb.OpenOpts{URL: o.databaseURL, Logger: log, MaxConns: 2,
				StatementTimeout: stmtTimeout, MigrateStatementTimeout: stmtTimeout, LockTimeout: lockTimeout, LocalMustExist: true})
			if err != nil {
				return err
			}
			defer db.Close()
			sqlDB := stdlib.OpenDBFromPool(db.Pool)
			defer sqlDB.Close()
			v, err := pgdb.SchemaVersion(cmd.Context(), sqlDB)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema at version %d\n", v)
			return nil
		},
	}
	cmd.Flags().DurationVar(&stmtTimeout, "db-statement-timeout", pgdb.MigrateStatementTimeoutDefault, "statement_timeout of the migrating connection (index builds may be long)")
	cmd.Flags().DurationVar(&lockTimeout, "db-lock-timeout", 10*time.Second, "lock_timeout of the migrating connection: a migration waiting behind live traffic fails instead of blocking it")
	// Longer than the runtime's timeouts by design: the consumer's
	// PROMPTLINE_DB_STATEMENT_TIMEOUT (or file key) must not cut a migration short.
	cliconfig.CommandLineOnly(cmd.Flags(), "db-statement-timeout")
	cliconfig.CommandLineOnly(cmd.Flags(), "db-lock-timeout")
	return cmd
}
