package pgdb_test

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestMigrationsApplyAndAreIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testkit.DatabaseURL(t)
	// The template is migrated already; opening again must be a no-op,
	// and several concurrent opens must serialise on the advisory lock.
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url})
			if err == nil {
				err = db.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM inputs").Scan(&n))
	require.Zero(t, n)
}

// The fallback for machines without a running server: a throwaway cluster
// from the PostgreSQL binaries, migrated and usable, removed on Stop.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The system temp directory: as root the cluster runs as "postgres",
	// which cannot enter a test's private TempDir.
	c, err := pgdb.StartCluster(ctx, "")
	require.NoError(t, err)
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: c.URL("postgres")})
	require.NoError(t, err)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n))
	require.NoError(t, db.Close())
	require.NoError(t, c.Stop())
	require.NoDirExists(t, c.Dir)
}

// A test binary killed by its timeout leaves no server behind: the
// watchdog stops the cluster and removes its directory when the process
// that holds the write end of its pipe is gone.
func TestThrowawayClusterStopsWhenItsProcessIsGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgdb.StartCluster(ctx, "")
	require.NoError(t, err)
	owner := watchedBy(t, c)
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err, "the watchdog leaves a cluster alone while its process lives")
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, owner.Process.Kill())
	_ = owner.Wait()
	requireStoppedAndRemoved(t, c)
}

// A killed process may stay a zombie, never reaped (a container whose
// first process reaps nothing, a parent killed too): its cluster must stop
// all the same, once the process can do nothing more.
func TestThrowawayClusterStopsWhenItsProcessIsKilledButNotReaped(t *testing.T) {
	t.Parallel()
	c, err := pgdb.StartCluster(context.Background(), "")
	require.NoError(t, err)
	owner := watchedBy(t, c)
	require.NoError(t, owner.Process.Kill())
	defer owner.Wait() // reaped only after the assertions
	requireStoppedAndRemoved(t, c)
}

// watchedBy starts a process that holds the write end of c's watchdog
// pipe, and the watchdog; this process keeps no end of it.
func watchedBy(t *testing.T, c *pgdb.Cluster) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	owner := exec.Command("sleep", "60")
	owner.ExtraFiles = []*os.File{w}
	require.NoError(t, owner.Start())
	require.NoError(t, w.Close())
	require.NoError(t, c.StopWhenClosed(r))
	require.NoError(t, r.Close())
	return owner
}

func requireStoppedAndRemoved(t *testing.T, c *pgdb.Cluster) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := os.Stat(c.Dir)
		return os.IsNotExist(err)
	}, 15*time.Second, 100*time.Millisecond, "stopped and removed after its process died")
	_, err := pgx.Connect(context.Background(), c.URL("postgres"))
	require.Error(t, err)
}

func TestTimeoutsAreSetPerConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: testkit.DatabaseURL(t), LockTimeout: 1500 * time.Millisecond})
	require.NoError(t, err)
	defer db.Close()
	var stmt, lock, idle string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
		current_setting('idle_in_transaction_session_timeout')`).Scan(&stmt, &lock, &idle))
	require.Equal(t, []string{"30s", "1500ms", "1min"}, []string{stmt, lock, idle})
}

// The newcomer's machine: a stock cluster answers on the default address
// and refuses the OS user (it asks a password on TCP, as Debian's does).
// Without a URL, Open falls back to the local cluster and says why; with
// that server's URL given explicitly, it reports the refusal.
func TestDefaultServerThatRefusesFallsBack(t *testing.T) {
	ctx := context.Background()
	stock, err := pgdb.StartClusterWith(ctx, &pgdb.ClusterConfig{Files: map[string][]byte{
		"pg_hba.conf": []byte("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stock.Stop()) })
	refusing := fmt.Sprintf("postgres://127.0.0.1:%d/promptline?sslmode=disable", stock.Port)

	_, err = pgdb.Open(ctx, pgdb.OpenOpts{URL: refusing})
	require.ErrorContains(t, err, "28P01", "an explicit URL is used as given")

	defer pgdb.SetDefaultURL(refusing)()
	var logs bytes.Buffer
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{LocalDir: localDir(t), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.NotEqual(t, refusing, db.URL)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM inputs").Scan(&n))
	require.NoError(t, db.Close())
	require.Contains(t, logs.String(), "refuses this user")
	require.Contains(t, logs.String(), "using the local PostgreSQL cluster")
	require.Contains(t, logs.String(), "--database-url")
}

// Every connection of the service comes from Open, so that the commit
// tracer of the crash sweep (faults builds) sees every write: a package
// that opened its own pool or connection would write past the sweep. This
// test fails on any such call outside pgdb; the bench, the test kit and
// the mutation runner (which only asks whether a server answers), which
// never run in the service, are the only exceptions.
func TestEveryPoolIsOpenedByPgdb(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	allowed := []string{"internal/pgdb/", "internal/testkit/", "cmd/bench/", "scripts/mutants/"}
	opening := map[string][]string{
		"github.com/jackc/pgx/v5/pgxpool": {"New", "NewWithConfig"},
		"github.com/jackc/pgx/v5":         {"Connect", "ConnectConfig"},
		"github.com/jackc/pgx/v5/pgconn":  {"Connect", "ConnectConfig"},
		"database/sql":                    {"Open", "OpenDB"},
	}
	var found []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for _, a := range allowed {
			if strings.HasPrefix(filepath.ToSlash(rel), a) {
				return nil
			}
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names := map[string][]string{} // local import name -> opening functions
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if fns, ok := opening[p]; ok {
				name := filepath.Base(p)
				if p == "github.com/jackc/pgx/v5" {
					name = "pgx"
				}
				if imp.Name != nil {
					name = imp.Name.Name
				}
				names[name] = fns
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && slices.Contains(names[id.Name], sel.Sel.Name) {
				found = append(found, fmt.Sprintf("%s: %s.%s", rel, id.Name, sel.Sel.Name))
			}
			return true
		})
		return nil
	}))
	require.Empty(t, found, "open Postgres through pgdb.Open, so that every write passes the commit tracer")
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test")
		dir = parent
	}
}
