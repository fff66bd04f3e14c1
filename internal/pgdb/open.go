package pgdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/faults"
	urlredact "github.com/promptline/promptline/internal/redact"
)

// DefaultURL is where promptline looks for Postgres when neither
// --database-url nor DATABASE_URL is set. The user is libpq's default
// (PGUSER, else the OS user).
const DefaultURL = "postgres://127.0.0.1:5432/promptline?sslmode=disable"

// defaultURL is DefaultURL, replaced in this package's tests by a server
// that answers and refuses, and in faults builds by
// PROMPTLINE_FAULT_DEFAULT_DATABASE_URL.
var defaultURL = cmp.Or(faults.DefaultDatabaseURL(), DefaultURL)

// OpenOpts says how to find the database.
type OpenOpts struct {
	// URL from the flag or DATABASE_URL; empty means: the default local
	// server, else the local cluster (local.go).
	URL string
	// MaxConns of the pool. Defaults to pgxpool's default.
	MaxConns int32
	// LocalDir is the local cluster's data directory. Defaults to
	// LocalDir().
	LocalDir string
	// LocalMustExist uses the local cluster only if it exists: an operator
	// command inspects data, and an empty new cluster has none
	// (ErrNoLocalCluster). Defaults to false: the consumer creates it.
	LocalMustExist bool
	// StatementTimeout bounds every statement. Defaults to 30s.
	StatementTimeout time.Duration
	// MigrateStatementTimeout bounds each statement of the migrations
	// Open applies. Defaults to the longer of MigrateStatementTimeoutDefault
	// and StatementTimeout: an index build on a large table may take far
	// longer than a runtime statement should, and a start that cut it
	// short would drop the half-built index, build it again and time out
	// again at every restart (docs/deploy.md, "Upgrades").
	MigrateStatementTimeout time.Duration
	// LockTimeout bounds every lock wait. Defaults to 10s.
	LockTimeout time.Duration
	// IdleInTxTimeout ends a session idle inside a transaction, so that a
	// paused or wedged process (SIGSTOP, a long GC pause, a hung network
	// call inside a transaction) cannot hold row and advisory locks that
	// block admission, takeover or the relay. Defaults to 60s.
	IdleInTxTimeout time.Duration
	// RoundTripTimeout is the longest the process waits for the server's
	// answer where its caller set no deadline, and the pool's
	// connections' TCP user timeout: a silent network partition or a
	// failover that sends no reset (the primary's host died) then costs a
	// connection this long, not the kernel's retransmissions (about 15
	// minutes, or for ever behind a middlebox that still acknowledges).
	// It bounds here the ping of a connection taken from the pool after
	// an idle second (pgxpool's PingTimeout) and, through TCP_USER_TIMEOUT
	// and keepalives (Linux), any round trip whose data the server does
	// not acknowledge; the writers that wait whatever their callers'
	// contexts (ledger's group commit, the relay's pass) take it as their
	// own deadline (RoundTripTimeoutFor). Defaults to StatementTimeout
	// plus RoundTripMargin.
	RoundTripTimeout time.Duration
	// NoMigrate applies no migration: Open only checks that the schema is
	// at this binary's version (a *SchemaVersionError otherwise), so that
	// a role without DDL rights can run. Defaults to false: migrate.
	NoMigrate bool
	Logger    *slog.Logger
}

// The defaults of Options' timeouts, exported so that the consumer's
// flags state them once.
const (
	StatementTimeoutDefault = 30 * time.Second
	LockTimeoutDefault      = 10 * time.Second
	IdleInTxTimeoutDefault  = 60 * time.Second
	// MigrateStatementTimeoutDefault is the statement timeout of the
	// migrating connection, at start and in `consumer migrate`.
	MigrateStatementTimeoutDefault = 15 * time.Minute
	// RoundTripMargin is how much longer than the statement timeout the
	// default RoundTripTimeout waits: the server ends a statement at its
	// statement timeout, and its error still has to come back.
	RoundTripMargin = 5 * time.Second
	// RoundTripTimeoutDefault is RoundTripTimeout with the default
	// statement timeout.
	RoundTripTimeoutDefault = StatementTimeoutDefault + RoundTripMargin
)

// RoundTripTimeoutFor is OpenOpts.RoundTripTimeout as Open uses it:
// roundTrip, or else the statement timeout (its default when zero) plus
// RoundTripMargin.
func RoundTripTimeoutFor(roundTrip, statementTimeout time.Duration) time.Duration {
	return cmp.Or(roundTrip, cmp.Or(statementTimeout, StatementTimeoutDefault)+RoundTripMargin)
}

// DB is an open, migrated database.
type DB struct {
	Pool  *pgxpool.Pool
	URL   string
	local *localCluster
	held  func() // the local cluster's lock, while Open connects
}

// closeWait bounds Close's wait for the pool's connections to close.
const closeWait = 2 * time.Second

// Close closes the pool and, when no other process uses the local
// cluster, stops it (its data stays).
//
// The wait for the connections is bounded (closeWait): pgx closes a
// connection whose statement a context cut off in the background, and
// gives it 15 s, which a server that answers nothing (a partition, a
// failover with no reset) takes in full; the pool's Close waited for all
// of them, and a stop overran --shutdown-grace by that much. The caller
// is a process that ends, whose sockets the kernel closes.
func (d *DB) Close() error {
	closed := make(chan struct{})
	go func() {
		d.Pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
	}
	return d.leaveLocal()
}

// Open resolves the database, connects, warns when the connection is
// unencrypted and leaves the machine, and applies migrations (or, with
// NoMigrate, checks the schema version). A schema newer than this binary
// is refused either way.
func Open(ctx context.Context, opts OpenOpts) (*DB, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	db := &DB{URL: opts.URL}
	if db.URL == "" {
		db.URL = defaultURL
		if err := ensureDatabase(ctx, defaultURL); err != nil {
			why := unusableDefault(err)
			if why == "" {
				return nil, fmt.Errorf("default database %s: %w (set --database-url or DATABASE_URL)", defaultURL, err)
			}
			dir := cmp.Or(opts.LocalDir, LocalDir())
			lc, started, unlock, lerr := openLocal(ctx, dir, opts.LocalMustExist)
			if lerr != nil {
				return nil, fmt.Errorf("%s (%v): %w", why, err, lerr)
			}
			// Held until this pool is connected: see openLocal.
			db.held = unlock
			log.InfoContext(ctx, why+"; using the local PostgreSQL cluster, whose data stays in its directory "+
				"(set --database-url or DATABASE_URL to use a server)",
				slog.String("default_url", defaultURL), slog.Any("error", err),
				slog.String("data_dir", lc.Dir), slog.Int("port", lc.Port), slog.Bool("started", started))
			db.local = lc
			db.URL = lc.URL("postgres")
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		db.stopCluster()
		return nil, fmt.Errorf("--database-url: %w", urlredact.Error(err))
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	rp := cfg.ConnConfig.RuntimeParams
	if db.local != nil {
		// Marks this handle's connections, which leaveLocal does not
		// count. This process counts as a user by its shared lock
		// (local.go), with or without a connection.
		rp["application_name"] = db.local.app
	}
	rp["statement_timeout"] = ms(cmp.Or(opts.StatementTimeout, StatementTimeoutDefault))
	rp["lock_timeout"] = ms(cmp.Or(opts.LockTimeout, LockTimeoutDefault))
	rp["idle_in_transaction_session_timeout"] = ms(cmp.Or(opts.IdleInTxTimeout, IdleInTxTimeoutDefault))
	roundTrip := RoundTripTimeoutFor(opts.RoundTripTimeout, opts.StatementTimeout)
	cfg.PingTimeout = roundTrip
	cfg.ConnConfig.DialFunc = dialer(cfg.ConnConfig.ConnectTimeout, roundTrip).DialContext
	if faults.Enabled {
		cfg.ConnConfig.Tracer = &commitTracer{wrote: map[*pgx.Conn]string{}}
	}
	db.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		db.stopCluster()
		return nil, fmt.Errorf("connecting to Postgres: %w", err)
	}
	if err := db.Pool.Ping(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connecting to Postgres at %s: %w", redact(cfg.ConnConfig), err)
	}
	db.release()
	if err := warnPlaintext(ctx, db.Pool, log); err != nil {
		db.Close()
		return nil, err
	}
	if opts.NoMigrate {
		err = CheckPool(ctx, db.Pool)
	} else {
		var from, to int64
		timeout := cmp.Or(opts.MigrateStatementTimeout,
			max(MigrateStatementTimeoutDefault, cmp.Or(opts.StatementTimeout, StatementTimeoutDefault)))
		from, to, err = migratePool(ctx, db.Pool, timeout)
		if err == nil && from != to {
			log.InfoContext(ctx, "schema migrated", slog.Int64("from_version", from), slog.Int64("to_version", to))
		}
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// stopCluster leaves the local cluster when the pool was never opened.
func (d *DB) stopCluster() { _ = d.leaveLocal() }

// release lets go of the local cluster's lock, if this handle holds it.
func (d *DB) release() {
	if d.held != nil {
		d.held()
		d.held = nil
	}
}

func (d *DB) leaveLocal() error {
	d.release()
	if d.local == nil {
		return nil
	}
	lc := d.local
	d.local = nil
	return lc.leave()
}

// ensureDatabase connects to url, creating its database when the server
// answers but the database does not exist.
func ensureDatabase(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return err
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	ac, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return err
	}
	defer ac.Close(ctx)
	_, err = ac.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: a concurrent start made it
		err = nil
	}
	return err
}

// UnusableDefault says why err, met connecting to the default local
// server, means a tool should start a throwaway cluster instead, or ""
// when it does not (see unusableDefault). cmd/bench resolves its server
// with it, so that it falls back exactly when the consumer does.
func UnusableDefault(err error) string { return unusableDefault(err) }

func ms(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }

// unusableDefault says why the default server cannot serve promptline
// without settings, or "" when it can, or when the error is one a retry or
// a setting of the server fixes (a full server, a timeout). Nothing
// listening is the fresh machine's case. A server that answers and refuses
// the OS user (SQLSTATE class 28: a stock Debian or Ubuntu cluster, which
// knows only "postgres" and asks a password on TCP) or lets it in without
// the right to create promptline's database (42501) is the newcomer's case:
// neither is promptline's to fix, and `make demo` must still work there.
func unusableDefault(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "no PostgreSQL on the default address"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"):
			return "the PostgreSQL on the default address refuses this user"
		case pgErr.Code == "42501":
			return "the PostgreSQL on the default address does not let this user create the promptline database"
		}
	}
	return ""
}

func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}
