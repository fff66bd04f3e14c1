package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// owners is design.md's "Table owners" table: each table's owning package,
// and the files outside it that still write the table.
type owners struct {
	pkg   map[string]string          // table → owning package (directory)
	other map[string]map[string]bool // table → files (slash paths) also writing it
	// unseen: table → listed files whose listing says the write is one
	// the scan cannot see (a row lock, a SQL function's call).
	unseen map[string]map[string]bool
}

var (
	ownerRow = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([^|]+) \\| ([^|]+) \\|$")
	goFile   = regexp.MustCompile("`([a-z0-9_/]+\\.go)`")
	// unseenWrite, in a listed file's description, says the scan cannot
	// see the write: "lock" (FOR UPDATE), "function" (a SQL function's
	// call).
	unseenWrite = regexp.MustCompile(`\block\b|\bfunction\b`)
	// A statement that writes a table: what follows the verb is the
	// table's name. "DO UPDATE SET", "FOR UPDATE SKIP LOCKED" and the like
	// name no table and are skipped because "set", "skip" are not tables.
	writeStmt = regexp.MustCompile(`(?is)\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([a-z_]+)\b`)
)

func readOwners(t *testing.T, md string) owners {
	t.Helper()
	o := owners{pkg: map[string]string{}, other: map[string]map[string]bool{}, unseen: map[string]map[string]bool{}}
	for _, m := range ownerRow.FindAllStringSubmatch(section(t, md, "Table owners"), -1) {
		pkg := backticked.FindStringSubmatch(m[2])
		require.NotNil(t, pkg, "Table owners: the row of %s names no owning package", m[1])
		o.pkg[m[1]] = pkg[1]
		o.other[m[1]] = map[string]bool{}
		o.unseen[m[1]] = map[string]bool{}
		files := goFile.FindAllStringSubmatchIndex(m[3], -1)
		for i, f := range files {
			name := m[3][f[2]:f[3]]
			o.other[m[1]][name] = true
			// The file's description runs to the next listed file.
			end := len(m[3])
			if i+1 < len(files) {
				end = files[i+1][0]
			}
			if unseenWrite.MatchString(m[3][f[1]:end]) {
				o.unseen[m[1]][name] = true
			}
		}
	}
	return o
}

// tableWrite is one SQL statement of production code that writes a table.
type tableWrite struct {
	table, file, where string // file: slash path from the module root
}

// srcFile is one parsed non-test Go file of the module.
type srcFile struct {
	rel  string // slash path from the module root
	fset *token.FileSet
	f    *ast.File
}

// productionFiles parses every non-test Go file of the module: the code
// the checks of this file hold to design.md. Tests build their crash
// states with their own statements and are not checked.
func productionFiles(t *testing.T) []srcFile {
	t.Helper()
	var out []srcFile
	fset := token.NewFileSet()
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin" || name == "target") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		out = append(out, srcFile{rel: rel, fset: fset, f: f})
		return nil
	})
	require.NoError(t, err)
	return out
}

// tableWrites returns the table writes in the string literals of files.
// cmd/bench is not checked: its statements fill scratch databases of its
// own (design.md says so under Table owners).
func tableWrites(files []srcFile, tables map[string]string) []tableWrite {
	var out []tableWrite
	eachStatement(files, func(sf srcFile, where, s string) {
		for _, m := range writeStmt.FindAllStringSubmatch(s, -1) {
			if _, ok := tables[strings.ToLower(m[1])]; ok {
				out = append(out, tableWrite{table: strings.ToLower(m[1]), file: sf.rel, where: where})
			}
		}
	})
	return out
}

// eachStatement calls fn with every string literal of files outside
// cmd/bench (whose statements fill scratch databases of its own), unquoted,
// and where it stands.
func eachStatement(files []srcFile, fn func(sf srcFile, where, s string)) {
	for _, sf := range files {
		if strings.HasPrefix(sf.rel, "cmd/bench/") {
			continue
		}
		ast.Inspect(sf.f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil {
				fn(sf, sf.fset.Position(lit.Pos()).String(), s)
			}
			return true
		})
	}
}

// ownershipViolations returns, for each write outside the table's owner
// that the table does not list, a line saying so.
func ownershipViolations(o owners, writes []tableWrite) []string {
	var bad []string
	for _, w := range writes {
		owner := o.pkg[w.table]
		if path.Dir(w.file) == owner || o.other[w.table][w.file] {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s: writes %s, which %s owns; call the owner's function instead (or, while that move is still to do, list the file under \"also written today by\")", w.where, w.table, owner))
	}
	slices.Sort(bad)
	return bad
}

// staleListings returns, for each file a table lists among its other
// writers in which the scan sees no write of that table (and whose
// listing does not say the write is one the scan cannot see), a line
// saying so: the write moved behind its owner, and the listing goes.
func staleListings(o owners, writes []tableWrite) []string {
	seen := map[[2]string]bool{}
	for _, w := range writes {
		seen[[2]string{w.table, w.file}] = true
	}
	var bad []string
	for table, files := range o.other {
		for f := range files {
			if !seen[[2]string{table, f}] && !o.unseen[table][f] {
				bad = append(bad, fmt.Sprintf("Table owners: %s lists %s among its writers, but the file writes no %s: drop it from the list", table, f, table))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// TestTableOwnership holds design.md's Table owners table to the code: a
// statement of production code that writes a table outside the package
// that owns it fails, unless the table lists the file among its other
// writers; a listed file that no longer exists, or in which the scan
// sees no write of the table (unless its listing says the write is one
// the scan cannot see), fails too, so the list shrinks as writes move
// behind their owners; so does an owner that is no package.
func TestTableOwnership(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("design.md")
	require.NoError(t, err)
	md := string(b)
	o := readOwners(t, md)
	require.GreaterOrEqual(t, len(o.pkg), 14, "Table owners lists too few tables: is the table's format still `| `table` | owner | others |`?")
	writes := tableWrites(productionFiles(t), o.pkg)
	// Every owning package writes at least one of its tables where the
	// scan can see it: a scan that found nothing would pass every check.
	seen := map[string]bool{}
	for _, w := range writes {
		seen[w.table] = true
	}
	for _, table := range []string{"sessions", "inputs", "outbox", "claims", "messages", "attempts", "tool_calls", "recoveries"} {
		require.True(t, seen[table], "no statement writing %s was found: the scan is broken", table)
	}
	require.Empty(t, ownershipViolations(o, writes))
	require.Empty(t, staleListings(o, writes))
	for table, pkg := range o.pkg {
		require.DirExists(t, filepath.Join("..", filepath.FromSlash(pkg)), "Table owners: %s's owner", table)
	}
	for table, files := range o.other {
		for f := range files {
			require.FileExists(t, filepath.Join("..", filepath.FromSlash(f)), "Table owners: %s lists %s among its writers", table, f)
		}
	}
}

// TestOwnershipViolations shows that the check fails a foreign write and
// passes the owner's and a listed one.
func TestOwnershipViolations(t *testing.T) {
	t.Parallel()
	o := readOwners(t, "\n## Table owners\n\n| table | owner | others |\n|---|---|---|\n"+
		"| `claims` | `ledger`, `claim.go` | `recovery/apply.go` (`carryOut`) |\n\n## Next\n")
	require.Equal(t, "ledger", o.pkg["claims"])
	writes := []tableWrite{
		{table: "claims", file: "ledger/claim.go", where: "a"},
		{table: "claims", file: "recovery/apply.go", where: "b"},
		{table: "claims", file: "recovery/quarantine.go", where: "c"},
		{table: "claims", file: "ledgerx/claim.go", where: "d"},
	}
	bad := ownershipViolations(o, writes)
	require.Len(t, bad, 2, "%v", bad)
	require.True(t, strings.HasPrefix(bad[0], "c: writes claims"), bad[0])
	require.True(t, strings.HasPrefix(bad[1], "d: writes claims"), bad[1])
	// A listed file the scan sees no write of fails, unless its
	// listing says the write is one the scan cannot see.
	o = readOwners(t, "\n## Table owners\n\n| table | owner | others |\n|---|---|---|\n"+
		"| `sessions` | `admission`, `admitter.go` | `ledger/claim.go` (`bumpTokenSQL`), `recovery/apply.go` (`carryOut`), `recovery/resolve.go` (`Resolve`: lock) |\n\n## Next\n")
	stale := staleListings(o, []tableWrite{{table: "sessions", file: "ledger/claim.go", where: "a"}})
	require.Equal(t, []string{"Table owners: sessions lists recovery/apply.go among its writers, but the file writes no sessions: drop it from the list"}, stale)
	require.Equal(t, []string{"sessions", "set"}, matchedVerbs("INSERT INTO sessions (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET x = 1"))
	require.Equal(t, []string{"claims", "skip"}, matchedVerbs("update claims SET a = 1; SELECT 1 FOR UPDATE SKIP LOCKED"))
}

func matchedVerbs(s string) []string {
	var out []string
	for _, m := range writeStmt.FindAllStringSubmatch(s, -1) {
		out = append(out, strings.ToLower(m[1]))
	}
	return out
}

// Driver errors are translated once per owner: in a package's errors.go
// (its interpretError) or in internal/pgdb, the driver layer itself.
const (
	pgxPath    = "github.com/jackc/pgx/v5"
	pgconnPath = "github.com/jackc/pgx/v5/pgconn"
)

// sqlstate is a SQLSTATE or a SQLSTATE class, as a Go string literal.
var sqlstate = regexp.MustCompile(`^"[0-9A-Z]{2}([0-9A-Z]{3})?"$`)

// driverErrorChecks returns, for each test of a driver error outside an
// errors.go file and internal/pgdb, a line saying so: a use of
// pgx.ErrNoRows or pgconn.PgError, or a comparison of a .Code (or a slice
// of it) with a SQLSTATE, by == or != or in a switch. The SQLSTATE is a
// string literal or a constant of the package set to one.
func driverErrorChecks(files []srcFile) []string {
	consts := map[string]map[string]bool{} // directory → names of SQLSTATE constants
	for _, sf := range files {
		dir := path.Dir(sf.rel)
		for _, d := range sf.f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && i < len(vs.Names) && sqlstate.MatchString(lit.Value) {
						if consts[dir] == nil {
							consts[dir] = map[string]bool{}
						}
						consts[dir][vs.Names[i].Name] = true
					}
				}
			}
		}
	}
	var bad []string
	for _, sf := range files {
		if path.Base(sf.rel) == "errors.go" || strings.HasPrefix(sf.rel, "internal/pgdb/") {
			continue
		}
		names := map[string]string{} // import path → name in this file
		for _, imp := range sf.f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			names[p] = path.Base(strings.TrimSuffix(p, "/v5"))
			if imp.Name != nil {
				names[p] = imp.Name.Name
			}
		}
		isSQLSTATE := func(e ast.Expr) bool {
			switch e := e.(type) {
			case *ast.BasicLit:
				return e.Kind == token.STRING && sqlstate.MatchString(e.Value)
			case *ast.Ident:
				return consts[path.Dir(sf.rel)][e.Name]
			}
			return false
		}
		isCode := func(e ast.Expr) bool {
			switch x := e.(type) {
			case *ast.SliceExpr:
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			}
			sel, ok := e.(*ast.SelectorExpr)
			return ok && sel.Sel.Name == "Code"
		}
		report := func(n ast.Node, what string) {
			bad = append(bad, fmt.Sprintf("%s: %s: translate driver errors in the package's errors.go (interpretError) and test its sentinels", sf.fset.Position(n.Pos()), what))
		}
		ast.Inspect(sf.f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok {
					switch {
					case names[pgxPath] != "" && id.Name == names[pgxPath] && n.Sel.Name == "ErrNoRows":
						report(n, "tests pgx.ErrNoRows")
					case names[pgconnPath] != "" && id.Name == names[pgconnPath] && n.Sel.Name == "PgError":
						report(n, "inspects a pgconn.PgError")
					}
				}
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) &&
					(isCode(n.X) && isSQLSTATE(n.Y) || isCode(n.Y) && isSQLSTATE(n.X)) {
					report(n, "compares a .Code with a SQLSTATE")
				}
			case *ast.SwitchStmt:
				if n.Tag == nil || !isCode(n.Tag) {
					return true
				}
				for _, c := range n.Body.List {
					if slices.ContainsFunc(c.(*ast.CaseClause).List, isSQLSTATE) {
						report(n, "switches on a .Code with SQLSTATE cases")
						break
					}
				}
			}
			return true
		})
	}
	slices.Sort(bad)
	return bad
}

// TestDriverErrorsTranslatedOnce holds design.md's rule beside Table
// owners: no production code tests pgx.ErrNoRows or a SQLSTATE outside a
// package's errors.go and internal/pgdb.
func TestDriverErrorsTranslatedOnce(t *testing.T) {
	t.Parallel()
	files := productionFiles(t)
	require.Empty(t, driverErrorChecks(files))
	// The translations exist where the scan can see them: a scan that
	// found nothing would pass every check.
	var inErrorsGo []srcFile
	for _, sf := range files {
		if path.Base(sf.rel) == "errors.go" {
			inErrorsGo = append(inErrorsGo, srcFile{rel: path.Dir(sf.rel) + "/checked.go", fset: sf.fset, f: sf.f})
		}
	}
	require.NotEmpty(t, driverErrorChecks(inErrorsGo), "the errors.go files test no driver error the scan can see: the scan is broken")

	t.Run("Synthetic", func(t *testing.T) {
		t.Parallel()
		const src = `package p

import (
	"errors"

	pg "github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const uniqueCode = "23505"

func f(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == uniqueCode {
		return true
	}
	if errors.As(err, &pgErr) && pgErr.Code[:2] != "22" {
		return true
	}
	switch pgErr.Code {
	case "40001":
		return true
	}
	return errors.Is(err, pg.ErrNoRows)
}

type resp struct{ Code int }

func g(r resp, s string) bool { return r.Code == 200 || s == "23505" }
`
		parse := func(rel string) srcFile {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
			require.NoError(t, err)
			return srcFile{rel: rel, fset: fset, f: f}
		}
		bad := driverErrorChecks([]srcFile{parse("recovery/apply.go")})
		require.Len(t, bad, 5, "%v", bad)
		for i, want := range []string{
			"recovery/apply.go:13:13: inspects a pgconn.PgError",
			"recovery/apply.go:14:31: compares a .Code with a SQLSTATE",
			"recovery/apply.go:17:31: compares a .Code with a SQLSTATE",
			"recovery/apply.go:20:2: switches on a .Code with SQLSTATE cases",
			"recovery/apply.go:24:24: tests pgx.ErrNoRows",
		} {
			require.True(t, strings.HasPrefix(bad[i], want), "%s, not %s", bad[i], want)
		}
		require.Empty(t, driverErrorChecks([]srcFile{parse("recovery/errors.go"), parse("internal/pgdb/transient.go")}))
	})
}
