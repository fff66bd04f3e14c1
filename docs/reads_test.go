package docs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// readerRow is a row of design.md's "Reads across owners": a file,
	// the tables of other owners it reads, and why.
	readerRow = regexp.MustCompile("(?m)^\\| `([a-z0-9_/]+\\.go)` \\| ([^|]+) \\| ([^|]+) \\|$")
	// A statement that reads a table: what follows FROM or JOIN. The FROM
	// of "DELETE FROM" is a write (writeStmt's), and is left out.
	readStmt = regexp.MustCompile(`(?is)\b(DELETE\s+)?(?:FROM|JOIN)\s+([a-z_]+)\b`)
)

// readers is design.md's "Reads across owners": file → tables it reads
// outside their owner.
type readers map[string]map[string]bool

func readReaders(t *testing.T, md string) readers {
	t.Helper()
	r := readers{}
	for _, m := range readerRow.FindAllStringSubmatch(section(t, md, "Reads across owners"), -1) {
		r[m[1]] = map[string]bool{}
		for _, tm := range backticked.FindAllStringSubmatch(m[2], -1) {
			r[m[1]][tm[1]] = true
		}
	}
	return r
}

// tableReads returns the reads, in the string literals of files, of the
// tables named in tables, by files outside each table's owner. cmd/bench
// is not checked, as for writes.
func tableReads(files []srcFile, tables map[string]string) []tableWrite {
	var out []tableWrite
	eachStatement(files, func(sf srcFile, where, s string) {
		for _, m := range readStmt.FindAllStringSubmatch(s, -1) {
			table := strings.ToLower(m[2])
			owner, ok := tables[table]
			if !ok || m[1] != "" || path.Dir(sf.rel) == owner {
				continue
			}
			out = append(out, tableWrite{table: table, file: sf.rel, where: where})
		}
	})
	return out
}

// readViolations returns, for each foreign read that design.md does not
// list, a line saying so, and for each listed read the scan no longer
// sees, another.
func readViolations(r readers, reads []tableWrite, owner map[string]string) []string {
	var bad []string
	seen := map[[2]string]bool{}
	for _, rd := range reads {
		seen[[2]string{rd.file, rd.table}] = true
		if !r[rd.file][rd.table] {
			bad = append(bad, fmt.Sprintf("%s: reads %s, which %s owns; call the owner's function, or list the read under \"Reads across owners\" with its reason", rd.where, rd.table, owner[rd.table]))
		}
	}
	for file, tables := range r {
		for table := range tables {
			if !seen[[2]string{file, table}] {
				bad = append(bad, fmt.Sprintf("Reads across owners: %s lists %s, but the file reads no %s outside its owner: drop it from the list", file, table, table))
			}
		}
	}
	slices.Sort(bad)
	bad = slices.Compact(bad)
	return bad
}

// TestReadsAcrossOwners holds design.md's "Reads across owners" to the
// code: a statement of production code that reads (FROM, JOIN) a table
// another package owns fails unless the file is listed with that table,
// and a listing the code no longer bears out fails too.
func TestReadsAcrossOwners(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("design.md")
	require.NoError(t, err)
	md := string(b)
	o := readOwners(t, md)
	r := readReaders(t, md)
	reads := tableReads(productionFiles(t), o.pkg)
	// The scan must find reads it knows of, or it would pass everything.
	require.True(t, slices.ContainsFunc(reads, func(rd tableWrite) bool {
		return rd.table == "attempts" && rd.file == "recovery/evidence.go"
	}), "the scan found no read of attempts in recovery/evidence.go: is it broken?")
	require.Empty(t, readViolations(r, reads, o.pkg))
	for file := range r {
		require.FileExists(t, filepath.Join("..", filepath.FromSlash(file)), "Reads across owners lists %s", file)
	}
}

// TestReadViolations shows the check failing an unlisted read and a stale
// listing, passing a listed one, and the scan telling reads from deletes.
func TestReadViolations(t *testing.T) {
	t.Parallel()
	md := "\n## Reads across owners\n\n| file | reads | why |\n|---|---|---|\n" +
		"| `recovery/evidence.go` | `attempts`, `claims` | evidence |\n\n## Next\n"
	r := readReaders(t, md)
	require.Equal(t, readers{"recovery/evidence.go": {"attempts": true, "claims": true}}, r)
	owner := map[string]string{"attempts": "ledger", "claims": "ledger"}
	bad := readViolations(r, []tableWrite{
		{table: "attempts", file: "recovery/evidence.go", where: "a"},
		{table: "attempts", file: "recovery/apply.go", where: "b"},
	}, owner)
	require.Equal(t, []string{
		"Reads across owners: recovery/evidence.go lists claims, but the file reads no claims outside its owner: drop it from the list",
		"b: reads attempts, which ledger owns; call the owner's function, or list the read under \"Reads across owners\" with its reason",
	}, bad)
	var found []string
	for _, m := range readStmt.FindAllStringSubmatch("DELETE FROM claims WHERE x IN (SELECT a FROM attempts JOIN tool_calls USING (b))", -1) {
		if m[1] == "" {
			found = append(found, m[2])
		}
	}
	require.Equal(t, []string{"attempts", "tool_calls"}, found)
}
