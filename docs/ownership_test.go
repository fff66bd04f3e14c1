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
}

var (
	ownerRow = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([^|]+) \\| ([^|]+) \\|$")
	goFile   = regexp.MustCompile("`([a-z0-9_/]+\\.go)`")
	// A statement that writes a table: what follows the verb is the
	// table's name. "DO UPDATE SET", "FOR UPDATE SKIP LOCKED" and the like
	// name no table and are skipped because "set", "skip" are not tables.
	writeStmt = regexp.MustCompile(`(?is)\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([a-z_]+)\b`)
)

func readOwners(t *testing.T, md string) owners {
	t.Helper()
	o := owners{pkg: map[string]string{}, other: map[string]map[string]bool{}}
	for _, m := range ownerRow.FindAllStringSubmatch(section(t, md, "Table owners"), -1) {
		pkg := backticked.FindStringSubmatch(m[2])
		require.NotNil(t, pkg, "Table owners: the row of %s names no owning package", m[1])
		o.pkg[m[1]] = pkg[1]
		o.other[m[1]] = map[string]bool{}
		for _, f := range goFile.FindAllStringSubmatch(m[3], -1) {
			o.other[m[1]][f[1]] = true
		}
	}
	return o
}

// tableWrite is one SQL statement of production code that writes a table.
type tableWrite struct {
	table, file, where string // file: slash path from the module root
}

// tableWrites returns the table writes in the string literals of every
// non-test Go file of the module. Tests build their crash states with
// their own statements and are not checked; neither is cmd/bench, whose
// statements fill scratch databases of its own (design.md says so under
// Table owners).
func tableWrites(t *testing.T, tables map[string]string) []tableWrite {
	t.Helper()
	var out []tableWrite
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
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin" || name == "target" || rel == "cmd/bench") {
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
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, m := range writeStmt.FindAllStringSubmatch(s, -1) {
				if _, ok := tables[strings.ToLower(m[1])]; ok {
					out = append(out, tableWrite{table: strings.ToLower(m[1]), file: rel, where: fset.Position(lit.Pos()).String()})
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	return out
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

// TestTableOwnership holds design.md's Table owners table to the code: a
// statement of production code that writes a table outside the package
// that owns it fails, unless the table lists the file among its other
// writers; a listed file that no longer exists fails too, so the list
// shrinks as writes move behind their owners; so does an owner that is
// no package.
func TestTableOwnership(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("design.md")
	require.NoError(t, err)
	md := string(b)
	o := readOwners(t, md)
	require.GreaterOrEqual(t, len(o.pkg), 14, "Table owners lists too few tables: is the table's format still `| `table` | owner | others |`?")
	writes := tableWrites(t, o.pkg)
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
