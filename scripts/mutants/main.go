// Command mutants is the targeted mode of scripts/mutation.sh
// (docs/testing.md, "Mutation score"). It finds the mutants gremlins makes
// (the same five default mutators, at the same file:line:column), and
// tests each against only the tests that run the statement it is in.
//
// Why our own: gremlins runs a package's whole suite once per mutant, and
// recovery's and the executor's suites take 20 to 60 s each with real
// Postgres, so a package of 400 mutants took hours on two cores. A test
// that never enters a function cannot see a mutant in it; knowing which
// tests enter which function (a coverage profile per test, taken once)
// cuts each mutant's run to the few tests that can kill it. It also tries
// the mutants of `case` conditions, which gremlins never runs (Go's
// coverage blocks hold case bodies, not case expressions). A mutant is
// applied with go's -overlay flag: no copy of the module, and the build
// cache keeps every other package.
//
//	go run ./scripts/mutants [-workers N] [-exclude REGEXP] [-seed N] [-also PKG,...] [-list] PKG
//	go run ./scripts/mutants -only FILE:LINE:COL[:MUTATOR] [-run REGEXP] [-also PKG,...] PKG
//
// -only tries the mutants at one place (a survivor, once its test is
// written); -run gives the tests to run instead of taking the coverage.
// -also names other packages whose tests run PKG's code (recovery's run
// continuations through the executor): their tests join PKG's, with their
// coverage of PKG, so that a mutant they kill counts as killed. With -run,
// the expression selects tests in PKG and in each of them (a package
// where it selects none passes).
//
// Prints one line per mutant (KILLED, LIVED, TIMED OUT, NOT VIABLE, NOT
// COVERED; a LIVED one with the tests that ran it), then the counts in
// gremlins' words, which scripts/mutation.sh reads. Tests need
// PostgreSQL as the suite does: DATABASE_URL, else the server on
// 127.0.0.1:5432, else a throwaway cluster started here for the whole run.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/pgdb"
)

func main() {
	workers := flag.Int("workers", 1, "mutants tested at once")
	exclude := flag.String("exclude", "", "skip the package's files whose path matches this regular expression")
	list := flag.Bool("list", false, "list the mutants and stop")
	coefficient := flag.Int("timeout-coefficient", 5, "a mutant's tests may take this many times their time without the mutant")
	only := flag.String("only", "", "try only the mutants at FILE:LINE:COL, or only MUTATOR there with FILE:LINE:COL:MUTATOR")
	runTests := flag.String("run", "", "run the tests this regular expression selects for every mutant, instead of taking the coverage")
	also := flag.String("also", "", "comma-separated packages whose tests also run against the mutants, where their coverage reaches them")
	seed := flag.Uint64("seed", 0, "try the mutants in an order shuffled by this seed (0: file order), so that a run stopped early has measured a random sample")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mutants [-workers N] [-exclude REGEXP] [-seed N] [-list] [-only FILE:LINE:COL[:MUTATOR]] [-run REGEXP] [-also PKG,...] PKG")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *workers < 1 || *coefficient < 1 {
		flag.Usage()
		os.Exit(2)
	}
	var skip *regexp.Regexp
	if *exclude != "" {
		var err error
		if skip, err = regexp.Compile(*exclude); err != nil {
			fmt.Fprintln(os.Stderr, "mutants: -exclude:", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *runTests != "" {
		if _, err := regexp.Compile(*runTests); err != nil {
			fmt.Fprintln(os.Stderr, "mutants: -run:", err)
			os.Exit(2)
		}
	}
	opts := options{skip: skip, list: *list, workers: *workers, coefficient: *coefficient, only: *only, run: *runTests, seed: *seed}
	for _, p := range strings.Split(*also, ",") {
		if p = strings.TrimSpace(p); p != "" {
			opts.also = append(opts.also, filepath.Clean(p))
		}
	}
	if err := run(ctx, filepath.Clean(flag.Arg(0)), opts); err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

// A mutant is one operator replaced, as gremlins names it.
type mutant struct {
	File    string // relative to the package directory
	Line    int
	Col     int // 1-based byte column of the operator
	Offset  int // byte offset of the operator in the file
	From    string
	To      string
	Mutator string
	Func    string // the enclosing function declaration, "" outside any
}

func (m mutant) String() string {
	return fmt.Sprintf("%s at %s:%d:%d", m.Mutator, m.File, m.Line, m.Col)
}

// funcRange is a function declaration's lines in one file.
type funcRange struct {
	file       string
	name       string
	start, end int
}

// The replacements of gremlins' default mutators (v0.6.0).
var (
	arithmetic = map[token.Token]token.Token{token.ADD: token.SUB, token.SUB: token.ADD, token.MUL: token.QUO, token.QUO: token.MUL, token.REM: token.MUL}
	boundary   = map[token.Token]token.Token{token.LSS: token.LEQ, token.LEQ: token.LSS, token.GTR: token.GEQ, token.GEQ: token.GTR}
	negation   = map[token.Token]token.Token{token.EQL: token.NEQ, token.NEQ: token.EQL, token.LEQ: token.GTR, token.GTR: token.LEQ, token.LSS: token.GEQ, token.GEQ: token.LSS}
	incdec     = map[token.Token]token.Token{token.INC: token.DEC, token.DEC: token.INC}
)

// findMutants lists the mutants of one file's source and its function
// declarations' line ranges.
func findMutants(fset *token.FileSet, name string, src []byte) ([]mutant, []funcRange, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, err
	}
	var funcs []funcRange
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			n := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				n = recvName(fd.Recv.List[0].Type) + "." + n
			}
			funcs = append(funcs, funcRange{file: name, name: n,
				start: fset.Position(fd.Pos()).Line, end: fset.Position(fd.End()).Line})
		}
	}
	enclosing := func(line int) string {
		for _, fr := range funcs {
			if line >= fr.start && line <= fr.end {
				return fr.name
			}
		}
		return ""
	}
	var out []mutant
	add := func(pos token.Pos, from token.Token, table map[token.Token]token.Token, mutator string) {
		to, ok := table[from]
		if !ok {
			return
		}
		p := fset.Position(pos)
		out = append(out, mutant{File: name, Line: p.Line, Col: p.Column, Offset: p.Offset,
			From: from.String(), To: to.String(), Mutator: mutator, Func: enclosing(p.Line)})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			// A string concatenation has no arithmetic mutant that
			// compiles; gremlins makes it anyway, and it is counted as not
			// viable. With a literal on either side it is plainly a string.
			if !isStringLit(n.X) && !isStringLit(n.Y) {
				add(n.OpPos, n.Op, arithmetic, "ARITHMETIC_BASE")
			}
			add(n.OpPos, n.Op, boundary, "CONDITIONALS_BOUNDARY")
			add(n.OpPos, n.Op, negation, "CONDITIONALS_NEGATION")
		case *ast.IncDecStmt:
			add(n.TokPos, n.Tok, incdec, "INCREMENT_DECREMENT")
		case *ast.UnaryExpr:
			if n.Op == token.SUB {
				add(n.OpPos, n.Op, map[token.Token]token.Token{token.SUB: token.ADD}, "INVERT_NEGATIVES")
			}
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Offset != out[j].Offset {
			return out[i].Offset < out[j].Offset
		}
		return out[i].Mutator < out[j].Mutator
	})
	return out, funcs, nil
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

func isStringLit(e ast.Expr) bool {
	b, ok := e.(*ast.BasicLit)
	return ok && b.Kind == token.STRING
}

// apply returns src with m's operator replaced.
func apply(src []byte, m mutant) ([]byte, error) {
	if !bytes.HasPrefix(src[m.Offset:], []byte(m.From)) {
		return nil, fmt.Errorf("%s: no %q at the offset", m, m.From)
	}
	out := make([]byte, 0, len(src)+1)
	out = append(out, src[:m.Offset]...)
	out = append(out, m.To...)
	return append(out, src[m.Offset+len(m.From):]...), nil
}

// coverage says which tests ran each coverage block and each function
// ("file\x00name"), and how long each test took.
type coverage struct {
	given     bool // tests holds one regular expression per package, given for every mutant
	tests     []testRef
	took      map[testRef]time.Duration
	funcsRun  map[string][]testRef
	blocksRun map[block][]testRef
	blocks    []block // every block of the package's measured files
}

// block is a coverage block: a run of statements, from its start to its
// end position (line and byte column, both 1-based; the end excluded).
type block struct {
	file                         string
	startLine, startCol, endLine int
	endCol                       int
}

func (b block) holds(line, col int) bool {
	after := line > b.startLine || line == b.startLine && col >= b.startCol
	before := line < b.endLine || line == b.endLine && col < b.endCol
	return after && before
}

// parseProfile returns the blocks of a coverage profile, each with whether
// it ran, and the functions of funcs that it saw run: a block counted at
// least once that starts within the function's lines. importPath is the
// package's, which prefixes the profile's files.
func parseProfile(r *bufio.Scanner, importPath string, funcs []funcRange) (map[string]bool, map[block]bool, error) {
	run := map[string]bool{}
	blocks := map[block]bool{}
	for r.Scan() {
		line := r.Text()
		if strings.HasPrefix(line, "mode:") || line == "" {
			continue
		}
		// path/file.go:12.34,15.2 3 1
		colon := strings.LastIndex(line, ":")
		fields := strings.Fields(line[colon+1:])
		if colon < 0 || len(fields) != 3 {
			return nil, nil, fmt.Errorf("coverage profile: cannot read %q", line)
		}
		file := line[:colon]
		if !strings.HasPrefix(file, importPath+"/") {
			continue
		}
		b := block{file: strings.TrimPrefix(file, importPath+"/")}
		if _, err := fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.startLine, &b.startCol, &b.endLine, &b.endCol); err != nil {
			return nil, nil, fmt.Errorf("coverage profile: cannot read %q", line)
		}
		ran := fields[2] != "0"
		blocks[b] = blocks[b] || ran
		if !ran {
			continue
		}
		for _, fr := range funcs {
			if fr.file == b.file && b.startLine >= fr.start && b.startLine <= fr.end {
				run[fr.file+"\x00"+fr.name] = true
			}
		}
	}
	return run, blocks, r.Err()
}

type options struct {
	skip                 *regexp.Regexp
	list                 bool
	workers, coefficient int
	only, run            string
	seed                 uint64
	also                 []string // other packages whose tests run the package's code
}

// testRef names one top-level test: its package directory and its name.
type testRef struct{ pkg, name string }

func (t testRef) String() string { return t.pkg + "." + t.name }

func run(ctx context.Context, pkg string, o options) error {
	bp, err := build.Default.ImportDir(pkg, 0)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(pkg)
	if err != nil {
		return err
	}
	importPath, err := goList(ctx, pkg)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	var mutants []mutant
	var funcs []funcRange
	sources := map[string][]byte{}
	for _, name := range bp.GoFiles {
		if o.skip != nil && o.skip.MatchString(filepath.ToSlash(filepath.Join(pkg, name))) {
			continue
		}
		src, err := os.ReadFile(filepath.Join(pkg, name))
		if err != nil {
			return err
		}
		ms, fs, err := findMutants(fset, name, src)
		if err != nil {
			return err
		}
		sources[name] = src
		mutants = append(mutants, ms...)
		funcs = append(funcs, fs...)
	}
	if o.only != "" {
		var at []mutant
		for _, m := range mutants {
			if o.only == fmt.Sprintf("%s:%d:%d", m.File, m.Line, m.Col) || o.only == fmt.Sprintf("%s:%d:%d:%s", m.File, m.Line, m.Col, m.Mutator) {
				at = append(at, m)
			}
		}
		if len(at) == 0 {
			return fmt.Errorf("-only: no mutant at %s in %s", o.only, pkg)
		}
		mutants = at
	}
	if o.list {
		for _, m := range mutants {
			fmt.Printf("%s (%s)\n", m, orOutside(m.Func))
		}
		fmt.Printf("%d mutants in %d files\n", len(mutants), len(sources))
		return nil
	}
	if o.seed != 0 {
		rand.New(rand.NewPCG(o.seed, 0)).Shuffle(len(mutants), func(i, j int) { mutants[i], mutants[j] = mutants[j], mutants[i] })
		fmt.Printf("mutants shuffled with seed %d\n", o.seed)
	}
	stopPostgres, err := ensurePostgres(ctx)
	if err != nil {
		return err
	}
	defer stopPostgres()
	tmp, err := os.MkdirTemp("", "promptline-mutants-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	var cov *coverage
	if o.run != "" {
		// The tests given, for every mutant, with a generous timeout; they
		// must pass without a mutant, or every mutant would look killed.
		cov = &coverage{took: map[testRef]time.Duration{}, given: true}
		for _, p := range append([]string{pkg}, o.also...) {
			check := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", o.run, "./"+p)
			if out, err := check.CombinedOutput(); err != nil {
				return fmt.Errorf("the tests -run %s selects in %s fail without a mutant: %w\n%s", o.run, p, err, out)
			}
			t := testRef{p, o.run}
			cov.tests = append(cov.tests, t)
			cov.took[t] = 2 * time.Minute
		}
	} else {
		if cov, err = coverageByTest(ctx, append([]string{pkg}, o.also...), importPath, tmp, funcs); err != nil {
			return err
		}
		fmt.Printf("coverage of %d tests taken in %s\n", len(cov.tests), time.Since(start).Round(time.Second))
	}

	results := make([]string, len(mutants))
	jobs := make(chan int)
	var wg sync.WaitGroup
	var printMu sync.Mutex
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				status, detail := testMutant(ctx, pkg, abs, filepath.Join(tmp, strconv.Itoa(w)), mutants[i], sources[mutants[i].File], cov, o.coefficient)
				results[i] = status
				printMu.Lock()
				fmt.Printf("%12s %s\n", status, mutants[i])
				if detail != "" {
					fmt.Printf("%12s %s\n", "", detail)
				}
				printMu.Unlock()
			}
		}()
	}
	for i := range mutants {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	n := map[string]int{}
	for _, s := range results {
		n[s]++
	}
	fmt.Printf("Killed: %d, Lived: %d, Not covered: %d\n", n["KILLED"], n["LIVED"], n["NOT COVERED"])
	fmt.Printf("Timed out: %d, Not viable: %d\n", n["TIMED OUT"], n["NOT VIABLE"])
	fmt.Printf("Mutants: %d, in %s\n", len(mutants), time.Since(start).Round(time.Second))
	return nil
}

func orOutside(f string) string {
	if f == "" {
		return "outside any function"
	}
	return f
}

func goList(ctx context.Context, pkg string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "./"+pkg).Output()
	if err != nil {
		return "", fmt.Errorf("go list ./%s: %w", pkg, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ensurePostgres sets DATABASE_URL for the tests when neither it nor a
// server on 127.0.0.1:5432 is there: a throwaway cluster, shared by every
// test run instead of one cluster per test binary. The cluster stops when
// the returned func runs or this process ends, however it ends
// (pgdb.Cluster.StopWhenClosed: it watches a pipe whose write end only
// this process holds).
func ensurePostgres(ctx context.Context) (stop func(), err error) {
	if os.Getenv("DATABASE_URL") != "" {
		return func() {}, nil
	}
	if c, err := pgx.Connect(ctx, "postgres://127.0.0.1:5432/postgres?sslmode=disable"); err == nil {
		c.Close(ctx)
		return func() {}, nil
	}
	cluster, err := pgdb.StartCluster(ctx, "")
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, errors.Join(err, cluster.Stop())
	}
	defer r.Close()
	if err := cluster.StopWhenClosed(r); err != nil {
		w.Close()
		return nil, errors.Join(err, cluster.Stop())
	}
	return func() { w.Close() }, os.Setenv("DATABASE_URL", cluster.URL("postgres"))
}

// coverageByTest builds each package's tests with coverage of importPath
// (the mutated package) once, then runs each top-level test alone for its
// profile.
func coverageByTest(ctx context.Context, pkgs []string, importPath, tmp string, funcs []funcRange) (*coverage, error) {
	cov := &coverage{took: map[testRef]time.Duration{}, funcsRun: map[string][]testRef{}, blocksRun: map[block][]testRef{}}
	seen := map[block]bool{}
	for i, pkg := range pkgs {
		bin := filepath.Join(tmp, fmt.Sprintf("cover%d.test", i))
		build := exec.CommandContext(ctx, "go", "test", "-c", "-covermode=set", "-coverpkg="+importPath, "-o", bin, "./"+pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("building the tests of %s with coverage: %w", pkg, err)
		}
		listCmd := exec.CommandContext(ctx, bin, "-test.list", ".")
		listCmd.Dir = pkg
		out, err := listCmd.Output()
		if err != nil {
			return nil, fmt.Errorf("listing the tests of %s: %w", pkg, err)
		}
		for _, name := range strings.Fields(string(out)) {
			if !strings.HasPrefix(name, "Test") && !strings.HasPrefix(name, "Example") {
				continue
			}
			t := testRef{pkg, name}
			cov.tests = append(cov.tests, t)
			profile := filepath.Join(tmp, "cover.out")
			cmd := exec.CommandContext(ctx, bin, "-test.run", "^"+regexp.QuoteMeta(name)+"$", "-test.count=1",
				"-test.timeout=10m", "-test.coverprofile="+profile)
			cmd.Dir = pkg
			began := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("%s fails without a mutant: %w\n%s", t, err, out)
			}
			cov.took[t] = time.Since(began)
			f, err := os.Open(profile)
			if err != nil {
				return nil, err
			}
			ran, blocks, err := parseProfile(bufio.NewScanner(f), importPath, funcs)
			f.Close()
			if err != nil {
				return nil, err
			}
			for fn := range ran {
				cov.funcsRun[fn] = append(cov.funcsRun[fn], t)
			}
			for b, ran := range blocks {
				if !seen[b] {
					seen[b] = true
					cov.blocks = append(cov.blocks, b)
				}
				if ran {
					cov.blocksRun[b] = append(cov.blocksRun[b], t)
				}
			}
		}
	}
	return cov, nil
}

// testsFor returns the tests that can see m: those that ran the coverage
// block it is in (only a test that runs a statement evaluates the
// operators in it); for a mutant in no block (a case condition, or a
// condition after a closure: Go's blocks leave them out), those that ran
// its function; for a mutant outside any function (a package-level
// initialiser runs for all), every test.
func (c *coverage) testsFor(m mutant) []testRef {
	if m.Func == "" || c.given {
		return c.tests
	}
	for _, b := range c.blocks {
		if b.file == m.File && b.holds(m.Line, m.Col) {
			return c.blocksRun[b]
		}
	}
	return c.funcsRun[m.File+"\x00"+m.Func]
}

// testMutant applies m through an overlay and runs the tests that can see
// it. A build failure is a mutant that is not viable; a run past the
// timeout counts as killed, apart, as gremlins counts it.
func testMutant(ctx context.Context, pkg, absPkg, dir string, m mutant, src []byte, cov *coverage, coefficient int) (status, detail string) {
	tests := cov.testsFor(m)
	if len(tests) == 0 {
		return "NOT COVERED", ""
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "ERROR", err.Error()
	}
	mutated, err := apply(src, m)
	if err != nil {
		return "ERROR", err.Error()
	}
	file := filepath.Join(dir, m.File)
	if err := os.WriteFile(file, mutated, 0o644); err != nil {
		return "ERROR", err.Error()
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(absPkg, m.File): file}})
	if err != nil {
		return "ERROR", err.Error()
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		return "ERROR", err.Error()
	}
	// Each package's tests run in one go test, the mutant's own package
	// first; the first failure kills the mutant.
	var pkgs []string
	byPkg := map[string][]testRef{}
	for _, t := range tests {
		if byPkg[t.pkg] == nil {
			pkgs = append(pkgs, t.pkg)
		}
		byPkg[t.pkg] = append(byPkg[t.pkg], t)
	}
	for _, p := range pkgs {
		var took time.Duration
		names := make([]string, len(byPkg[p]))
		for i, t := range byPkg[p] {
			took += cov.took[t]
			names[i] = regexp.QuoteMeta(t.name)
		}
		runArg := "^(" + strings.Join(names, "|") + ")$"
		if cov.given {
			runArg = byPkg[p][0].name
		}
		if status := runTests(ctx, overlayFile, p, runArg, max(time.Duration(coefficient)*took, 30*time.Second)); status != "LIVED" {
			return status, ""
		}
	}
	ran := make([]string, len(tests))
	for i, t := range tests {
		ran[i] = t.String()
	}
	return "LIVED", "ran: " + strings.Join(ran, " ")
}

// runTests runs the tests runArg selects in pkg with the overlay and says
// what became of the mutant: LIVED when they pass.
func runTests(ctx context.Context, overlayFile, pkg, runArg string, timeout time.Duration) string {
	// The build is not timed; the outer bound only stops a run that hangs
	// past the test binary's own timeout.
	runCtx, cancel := context.WithTimeout(ctx, timeout+10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, "go", "test", "-overlay", overlayFile, "-count=1", "-failfast",
		"-timeout", timeout.String(), "-run", runArg, "./"+pkg)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	switch {
	case err == nil:
		return "LIVED"
	case bytes.Contains(out, []byte("[build failed]")) || bytes.Contains(out, []byte("[setup failed]")):
		return "NOT VIABLE"
	case runCtx.Err() != nil || bytes.Contains(out, []byte("panic: test timed out")):
		return "TIMED OUT"
	}
	return "KILLED"
}
