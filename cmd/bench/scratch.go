package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
)

// defaultServerURL is the local server's maintenance database: the bench
// only needs somewhere to issue CREATE DATABASE from.
const defaultServerURL = "postgres://127.0.0.1:5432/postgres?sslmode=disable"

// dropTimeout bounds dropping one scratch database, which also runs after
// Ctrl-C on a context that is no longer cancelled.
const dropTimeout = 30 * time.Second

// consumerMaxConns mirrors the consumer's --db-max-conns default.
const consumerMaxConns = 32

// poolOpts are the per-run Postgres knobs. The zero value is what the
// consumer ships with (--db-max-conns 32; the server's synchronous_commit).
type poolOpts struct {
	// MaxConns of the pool. Defaults to 32, the consumer's default.
	MaxConns int32
	// SyncCommitOff sets synchronous_commit=off on every connection.
	SyncCommitOff bool
}

// scratchServer creates fresh, migrated databases named
// promptline_bench_<random> on one server and drops them: each measurement
// starts on empty tables, so that one run's rows, dead tuples and
// autovacuum do not tax the next.
type scratchServer struct {
	admin   *pgx.ConnConfig
	cluster *pgdb.Cluster // a throwaway cluster started for this run, or nil

	mu    sync.Mutex
	names []string // created and not yet dropped
}

// newScratchServer resolves the server: rawURL when set; else the local
// server on 127.0.0.1:5432; else, when that one is absent or refuses this
// user (the consumer's rule, pgdb.UnusableDefault), a throwaway cluster
// started here and stopped by close. The throwaway cluster runs with
// fsync on, so that its commit cost is a disk's, as a real server's is,
// and loads pg_stat_statements when the machine's PostgreSQL has it.
func newScratchServer(ctx context.Context, rawURL string, log func(format string, args ...any)) (*scratchServer, error) {
	cfg, err := pgx.ParseConfig(cmp.Or(rawURL, defaultServerURL))
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	s := &scratchServer{admin: cfg}
	if rawURL != "" {
		return s, nil
	}
	err = s.adminExec(ctx, "SELECT 1")
	why := pgdb.UnusableDefault(err)
	if err == nil || why == "" {
		// Usable, or an error a retry or a setting fixes: the first
		// measurement reports it with the server's address.
		return s, nil
	}
	log("%s (%v); starting a throwaway cluster (set --database-url or DATABASE_URL to use a server)", why, err)
	// pg_stat_statements counts the statements per turn of the
	// burn-down, those the client sends and those run inside functions
	// (track=all); its cost per statement is small against a turn's.
	s.cluster, err = pgdb.StartClusterWith(ctx, &pgdb.ClusterConfig{Settings: map[string]string{
		"fsync": "on", "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
	}})
	if err != nil {
		log("starting with pg_stat_statements: %v; again without it (no statement counts)", err)
		s.cluster, err = pgdb.StartClusterWith(ctx, &pgdb.ClusterConfig{Settings: map[string]string{"fsync": "on"}})
	}
	if err != nil {
		return nil, err
	}
	if s.admin, err = pgx.ParseConfig(s.cluster.URL("postgres")); err != nil {
		return nil, errors.Join(err, s.cluster.Stop())
	}
	return s, nil
}

// close drops what is left and stops a throwaway cluster.
func (s *scratchServer) close(ctx context.Context) error {
	err := s.dropAll(ctx)
	if s.cluster != nil {
		err = errors.Join(err, s.cluster.Stop())
	}
	return err
}

// adminExec runs one statement on a short-lived connection to the
// server's own database (CREATE/DROP DATABASE cannot run in a pool's
// transaction-scoped helpers, and must not run on the database dropped).
func (s *scratchServer) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.ConnectConfig(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("connecting to Postgres at %s:%d: %w", s.admin.Host, s.admin.Port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// scratchDB is one fresh database and a pool on it.
type scratchDB struct {
	Name string
	Pool *pgxpool.Pool
	s    *scratchServer
}

// create makes, migrates and opens a new scratch database.
func (s *scratchServer) create(ctx context.Context, opts poolOpts) (*scratchDB, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "promptline_bench_" + hex.EncodeToString(b[:])
	if err := s.adminExec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("creating scratch database %s: %w", name, err)
	}
	s.mu.Lock()
	s.names = append(s.names, name)
	s.mu.Unlock()
	db := &scratchDB{Name: name, s: s}

	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, errors.Join(err, db.drop(ctx))
	}
	cfg.ConnConfig = s.admin.Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = cmp.Or(opts.MaxConns, consumerMaxConns)
	if opts.SyncCommitOff {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	db.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("opening %s: %w", name, err), db.drop(ctx))
	}
	if err := pgdb.MigratePool(ctx, db.Pool); err != nil {
		return nil, errors.Join(err, db.drop(ctx))
	}
	return db, nil
}

// drop closes the pool and drops the database, even after ctx was
// cancelled (Ctrl-C), within dropTimeout.
func (db *scratchDB) drop(ctx context.Context) error {
	if db.Pool != nil {
		db.Pool.Close()
	}
	return db.s.drop(ctx, db.Name)
}

func (s *scratchServer) drop(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropTimeout)
	defer cancel()
	err := s.adminExec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("dropping scratch database %s: %w", name, err)
	}
	s.mu.Lock()
	s.names = slices.DeleteFunc(s.names, func(n string) bool { return n == name })
	s.mu.Unlock()
	return nil
}

// dropAll drops what a failed or interrupted measurement left behind.
func (s *scratchServer) dropAll(ctx context.Context) error {
	s.mu.Lock()
	names := slices.Clone(s.names)
	s.mu.Unlock()
	var errs []error
	for _, n := range names {
		errs = append(errs, s.drop(ctx, n))
	}
	return errors.Join(errs...)
}

// serverFacts describes the server: version and the settings that decide
// commit cost.
func (s *scratchServer) serverFacts(ctx context.Context) (map[string]string, error) {
	conn, err := pgx.ConnectConfig(ctx, s.admin)
	if err != nil {
		return nil, fmt.Errorf("connecting to Postgres at %s:%d: %w", s.admin.Host, s.admin.Port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	facts := map[string]string{}
	for _, name := range []string{"server_version", "synchronous_commit", "fsync", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		facts[name] = v
	}
	return facts, nil
}
