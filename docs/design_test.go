package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// design is what design.md defines.
type design struct {
	invariants  map[int]bool
	promises    map[int]bool
	windows     map[string]bool
	crashPoints map[string]bool
	tests       []string // every Test... design.md names, subtests as Test/Sub
}

var (
	numberedItem = regexp.MustCompile(`(?m)^(\d+)\. `)
	promiseRow   = regexp.MustCompile(`(?m)^\| P(\d+) \|`)
	windowRow    = regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\| [^|]+ \\| ([^|]+) \\|")
	backticked   = regexp.MustCompile("`([^`]+)`")
	testName     = regexp.MustCompile("`(Test[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)?)`")

	// "invariant 7", "invariants 5 and 13", "invariants 4-7", "4/9".
	invariantCite = regexp.MustCompile(`(?i)(package's\s+)?\binvariants?\s+(\d+(?:\s*(?:,|and|or|-|–|/)\s*\d+)*)`)
	// The list items of a package doc that says it follows design.md's
	// numbering: "  - 4. ..." or "  - 4/9. ...".
	numberedDocItem = regexp.MustCompile(`(?m)^\s*-\s+(\d+(?:/\d+)*)\.\s`)
	windowCite      = regexp.MustCompile(`(?i)crash\s+window\s+"([^"]+)"`)
	promiseCite     = regexp.MustCompile(`\bP(\d+)\b`)
	numbers         = regexp.MustCompile(`\d+|[-–]`)
)

// section returns the text of design.md under heading "## name", up to the
// next heading of that level.
func section(t *testing.T, md, name string) string {
	t.Helper()
	_, after, ok := strings.Cut(md, "\n## "+name+"\n")
	require.True(t, ok, "design.md has no section %q", name)
	body, _, _ := strings.Cut(after, "\n## ")
	return body
}

func readDesign(t *testing.T) design {
	t.Helper()
	b, err := os.ReadFile("design.md")
	require.NoError(t, err)
	md := string(b)
	d := design{invariants: map[int]bool{}, promises: map[int]bool{}, windows: map[string]bool{}, crashPoints: map[string]bool{}}
	for _, m := range numberedItem.FindAllStringSubmatch(section(t, md, "Invariants"), -1) {
		n, _ := strconv.Atoi(m[1])
		d.invariants[n] = true
	}
	for _, m := range promiseRow.FindAllStringSubmatch(section(t, md, "Promises"), -1) {
		n, _ := strconv.Atoi(m[1])
		d.promises[n] = true
	}
	for _, m := range windowRow.FindAllStringSubmatch(section(t, md, "Crash windows"), -1) {
		d.windows[m[1]] = true
		for _, p := range backticked.FindAllStringSubmatch(m[2], -1) {
			d.crashPoints[p[1]] = true
		}
	}
	for _, m := range testName.FindAllStringSubmatch(md, -1) {
		d.tests = append(d.tests, m[1])
	}
	return d
}

// cited is what one comment cites.
type cited struct {
	invariants []int
	promises   []int
	windows    []string
}

// citations parses the citations of one comment's text. numbered says that
// the comment follows design.md's numbering in a list ("  - 7. ...").
func citations(text string, numbered bool) cited {
	var c cited
	for _, m := range invariantCite.FindAllStringSubmatch(text, -1) {
		if m[1] != "" {
			continue // a package's own list of invariants, not design.md's
		}
		c.invariants = append(c.invariants, expand(m[2])...)
	}
	if numbered {
		for _, m := range numberedDocItem.FindAllStringSubmatch(text, -1) {
			c.invariants = append(c.invariants, expand(m[1])...)
		}
	}
	for _, m := range windowCite.FindAllStringSubmatch(text, -1) {
		c.windows = append(c.windows, m[1])
	}
	if strings.Contains(text, "design.md") {
		for _, m := range promiseCite.FindAllStringSubmatch(text, -1) {
			n, _ := strconv.Atoi(m[1])
			c.promises = append(c.promises, n)
		}
	}
	return c
}

// expand turns "5 and 13" into 5, 13 and "4-7" into 4, 5, 6, 7.
func expand(list string) []int {
	var out []int
	tokens := numbers.FindAllString(list, -1)
	for i := 0; i < len(tokens); i++ {
		if tokens[i] == "-" || tokens[i] == "–" {
			continue
		}
		n, _ := strconv.Atoi(tokens[i])
		if i+2 < len(tokens) && (tokens[i+1] == "-" || tokens[i+1] == "–") {
			to, _ := strconv.Atoi(tokens[i+2])
			for k := n; k <= to; k++ {
				out = append(out, k)
			}
			i += 2
			continue
		}
		out = append(out, n)
	}
	return out
}

// comment is the text of one comment group (Go) or run of -- lines (SQL).
type comment struct {
	where string
	text  string
}

// repoComments returns the comments of every Go file of the module and of
// every SQL migration, and the names of every top-level test function and
// t.Run subtest literal.
func repoComments(t *testing.T) (comments []comment, tests map[string]bool, subtests map[string]bool, faultPoints []string) {
	t.Helper()
	tests, subtests = map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin" || name == "target") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		switch {
		case strings.HasSuffix(name, ".go"):
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, g := range f.Comments {
				comments = append(comments, comment{where: fset.Position(g.Pos()).String(), text: g.Text()})
			}
			collectTests(f, tests, subtests)
			if rel == filepath.Join("internal", "faults", "doc.go") {
				faultPoints = constStrings(f)
			}
		case strings.HasSuffix(name, ".sql") && strings.Contains(rel, filepath.Join("pgdb", "migrations")):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var text []string
			for i, line := range strings.Split(string(b), "\n") {
				if body, ok := strings.CutPrefix(strings.TrimSpace(line), "--"); ok {
					text = append(text, strings.TrimSpace(body))
					continue
				}
				if len(text) > 0 {
					comments = append(comments, comment{where: rel + ":" + strconv.Itoa(i), text: strings.Join(text, "\n")})
					text = nil
				}
			}
			if len(text) > 0 {
				comments = append(comments, comment{where: rel, text: strings.Join(text, "\n")})
			}
		}
		return nil
	})
	require.NoError(t, err)
	return comments, tests, subtests, faultPoints
}

func collectTests(f *ast.File, tests, subtests map[string]bool) {
	for _, decl := range f.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
			tests[fn.Name.Name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Run" {
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					subtests[s] = true
				}
			}
		}
		return true
	})
}

// constStrings returns the values of the string constants of f.
func constStrings(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			for _, v := range spec.(*ast.ValueSpec).Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					out = append(out, s)
				}
			}
		}
	}
	return out
}

func TestDesignCitations(t *testing.T) {
	t.Parallel()
	d := readDesign(t)
	require.Len(t, d.invariants, 14, "design.md numbers its invariants 1 to 14")
	require.Len(t, d.promises, 6, "design.md has the promises P1 to P6")
	require.NotEmpty(t, d.windows, "design.md names its crash windows")

	comments, tests, subtests, faultPoints := repoComments(t)
	require.NotEmpty(t, faultPoints, "the crash points of internal/faults/doc.go")

	t.Run("CodeCitesOnlyWhatDesignDefines", func(t *testing.T) {
		t.Parallel()
		var bad []string
		var invariantCites, windowCites int
		for _, c := range comments {
			got := citations(c.text, strings.Contains(c.text, "docs/design.md numbering"))
			for _, n := range got.invariants {
				invariantCites++
				if !d.invariants[n] {
					bad = append(bad, c.where+": invariant "+strconv.Itoa(n))
				}
			}
			for _, n := range got.promises {
				if !d.promises[n] {
					bad = append(bad, c.where+": P"+strconv.Itoa(n))
				}
			}
			for _, w := range got.windows {
				windowCites++
				if !d.windows[w] {
					bad = append(bad, c.where+`: crash window "`+w+`"`)
				}
			}
		}
		require.Empty(t, bad, "cited in the code, not defined in docs/design.md")
		// The parse found the citations the tree is known to have, so an
		// empty list above means something.
		require.Greater(t, invariantCites, 40, "invariant citations found")
		require.Positive(t, windowCites, "crash window citations found")
	})

	t.Run("EveryCrashPointIsAWindow", func(t *testing.T) {
		t.Parallel()
		var missing []string
		for _, p := range faultPoints {
			if !d.crashPoints[p] {
				missing = append(missing, p)
			}
		}
		require.Empty(t, missing, "crash points of internal/faults that no crash window of docs/design.md names")
	})

	t.Run("EveryTestNamedExists", func(t *testing.T) {
		t.Parallel()
		require.NotEmpty(t, d.tests)
		var missing []string
		for _, name := range d.tests {
			top, sub, _ := strings.Cut(name, "/")
			if !tests[top] || (sub != "" && !subtests[sub]) {
				missing = append(missing, name)
			}
		}
		require.Empty(t, missing, "tests named in docs/design.md that do not exist")
	})
}

// TestCitationsParse checks the parser on citations of every shape the
// code uses, so that a citation it missed cannot pass for a clean tree.
func TestCitationsParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text     string
		numbered bool
		want     cited
	}{
		{text: "(docs/design.md, invariant 7)", want: cited{invariants: []int{7}}},
		{text: "(docs/design.md,\ninvariants 5 and 13)", want: cited{invariants: []int{5, 13}}},
		{text: "One writer per session (docs/design.md, P3, invariants 4-7)", want: cited{invariants: []int{4, 5, 6, 7}, promises: []int{3}}},
		{text: "Invariant 14: a prompt whose ID", want: cited{invariants: []int{14}}},
		{text: "classified (this package's invariant 2)", want: cited{}},
		{text: "P4 without the design named", want: cited{}},
		{text: "a duplicate (docs/design.md, crash window\n\"outbox-published\")", want: cited{windows: []string{"outbox-published"}}},
		{text: "Invariants (docs/design.md numbering):\n\n  - 4/9. takeover\n  - 13. transient", numbered: true, want: cited{invariants: []int{4, 9, 13}}},
	} {
		got := citations(tc.text, tc.numbered)
		require.Equal(t, tc.want, got, "%q", tc.text)
	}
	require.True(t, slices.Equal([]int{1, 2, 3}, expand("1–3")))
}
