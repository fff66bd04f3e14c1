package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver pgtestdb opens
	"github.com/peterldowns/pgtestdb"
	"go.uber.org/goleak"

	"github.com/promptline/promptline/internal/pgdb"
)

var (
	serverOnce sync.Once
	serverConf pgtestdb.Config
	serverErr  error
	cluster    *pgdb.Cluster
)

// Main runs the tests of a package, then stops a throwaway cluster if one
// was started, then checks that no goroutine leaked.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping throwaway PostgreSQL:", err)
		}
	}
	if watchdogPipe != nil {
		// The cluster is stopped: its watchdog may end now (it finds
		// nothing left to stop).
		_ = watchdogPipe.Close()
	}
	if code == 0 {
		if err := goleak.Find(LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// LeakOptions lists goroutines that outlive their owner by design of a
// dependency.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		// pgx's pool closes its background health check asynchronously.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// database/sql's connection opener exits when the DB is closed, a
		// moment later.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// Sarama's per-topic circuit breaker, opened by failed metadata
		// lookups (a topic that does not exist), closes itself after 10s
		// in a goroutine nobody can stop.
		goleak.IgnoreAnyFunction("github.com/eapache/go-resiliency/breaker.(*Breaker).timer"),
	}
}

func server() (pgtestdb.Config, error) {
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		raw := os.Getenv("DATABASE_URL")
		if raw == "" {
			raw = "postgres://127.0.0.1:5432/postgres?sslmode=disable"
			if c, err := pgx.Connect(ctx, raw); err == nil {
				c.Close(ctx)
			} else {
				cluster, serverErr = pgdb.StartCluster(ctx, "")
				if serverErr != nil {
					serverErr = fmt.Errorf("tests need PostgreSQL: nothing answers on 127.0.0.1:5432 and none could be started: %w", serverErr)
					return
				}
				if err := watchCluster(); err != nil {
					fmt.Fprintln(os.Stderr, err) // a leak only if this binary is killed
				}
				raw = cluster.URL("postgres")
			}
		}
		serverConf, serverErr = confFromURL(raw)
	})
	return serverConf, serverErr
}

// watchdogPipe is the write end of the throwaway cluster's watchdog pipe,
// open until this binary exits: referenced here so that no finalizer
// closes it earlier.
var watchdogPipe *os.File

// watchCluster has the throwaway cluster stop itself once this binary is
// gone, however it ends (see pgdb.Cluster.StopWhenClosed).
func watchCluster() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if err := cluster.StopWhenClosed(r); err != nil {
		w.Close()
		return err
	}
	watchdogPipe = w
	return nil
}

func confFromURL(raw string) (pgtestdb.Config, error) {
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return pgtestdb.Config{}, fmt.Errorf("DATABASE_URL: %w", err)
	}
	u := cfg.User
	if u == "" {
		if cu, err := user.Current(); err == nil {
			u = cu.Username
		}
	}
	opts := url.Values{}
	opts.Set("sslmode", "disable")
	if parsed, err := url.Parse(raw); err == nil && parsed.Query().Get("sslmode") != "" {
		opts.Set("sslmode", parsed.Query().Get("sslmode"))
	}
	return pgtestdb.Config{
		DriverName: "pgx", Host: cfg.Host, Port: fmt.Sprint(cfg.Port), User: u,
		Password: cfg.Password, Database: cfg.Database, Options: opts.Encode(),
		ForceTerminateConnections: true,
	}, nil
}

type migrator struct{}

func (migrator) Hash() (string, error) { return pgdb.MigrationsHash(), nil }
func (migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	return pgdb.Migrate(ctx, db)
}

// DatabaseURL returns the URL of a fresh, migrated database for this test.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	conf, err := server()
	if err != nil {
		tb.Fatal(err)
	}
	return pgtestdb.Custom(tb, conf, migrator{}).URL()
}

// Pool returns a pool on a fresh, migrated database for this test.
func Pool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	dbURL := DatabaseURL(tb)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, dbURL
}

// Count runs a query that returns one integer (a count(*), usually) and
// fails the test on any error. The test bundles of every package count
// through it.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	tb.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("count %q: %v", sql, err)
	}
	return n
}
