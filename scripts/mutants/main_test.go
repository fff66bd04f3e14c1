package main

import (
	"bufio"
	"go/token"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const sample = `package p

const limit = 3 - 1

type T struct{}

func (t *T) Fits(n int) bool {
	if n <= limit && n != 0 {
		return true
	}
	return "a"+"b" == "c"
}

func count(xs []int) (n int) {
	for range xs {
		n++
	}
	switch {
	case n > 2:
		return -n
	}
	return n % 2
}
`

// The mutants are gremlins' five default mutators at the operator's
// 1-based byte column, each with its enclosing function; a string
// concatenation gets no arithmetic mutant.
func TestFindMutants(t *testing.T) {
	ms, funcs, err := findMutants(token.NewFileSet(), "p.go", []byte(sample))
	require.NoError(t, err)
	var got []string
	for _, m := range ms {
		got = append(got, m.String()+" in "+orOutside(m.Func))
	}
	require.Equal(t, []string{
		"ARITHMETIC_BASE at p.go:3:17 in outside any function",
		"CONDITIONALS_BOUNDARY at p.go:8:7 in T.Fits",
		"CONDITIONALS_NEGATION at p.go:8:7 in T.Fits",
		"CONDITIONALS_NEGATION at p.go:8:21 in T.Fits",
		"CONDITIONALS_NEGATION at p.go:11:17 in T.Fits",
		"INCREMENT_DECREMENT at p.go:16:4 in count",
		"CONDITIONALS_BOUNDARY at p.go:19:9 in count",
		"CONDITIONALS_NEGATION at p.go:19:9 in count",
		"INVERT_NEGATIVES at p.go:20:10 in count",
		"ARITHMETIC_BASE at p.go:22:11 in count",
	}, got)
	require.Equal(t, []funcRange{{"p.go", "T.Fits", 7, 12}, {"p.go", "count", 14, 23}}, funcs)

	byPos := func(pos, mutator string) mutant {
		for _, m := range ms {
			if strings.HasSuffix(m.String(), pos) && m.Mutator == mutator {
				return m
			}
		}
		t.Fatalf("no %s at %s", mutator, pos)
		return mutant{}
	}
	for _, c := range []struct{ pos, mutator, line string }{
		{"p.go:8:7", "CONDITIONALS_BOUNDARY", "\tif n < limit && n != 0 {"},
		{"p.go:8:7", "CONDITIONALS_NEGATION", "\tif n > limit && n != 0 {"},
		{"p.go:8:21", "CONDITIONALS_NEGATION", "\tif n <= limit && n == 0 {"},
		{"p.go:16:4", "INCREMENT_DECREMENT", "\t\tn--"},
		{"p.go:20:10", "INVERT_NEGATIVES", "\t\treturn +n"},
		{"p.go:22:11", "ARITHMETIC_BASE", "\treturn n * 2"},
	} {
		m := byPos(c.pos, c.mutator)
		out, err := apply([]byte(sample), m)
		require.NoError(t, err)
		lines := strings.Split(string(out), "\n")
		require.Equal(t, c.line, lines[m.Line-1], "%s", m)
		require.Len(t, out, len(sample)+len(m.To)-len(m.From))
	}
	_, err = apply([]byte(strings.Replace(sample, "n <= limit", "n == limit", 1)), byPos("p.go:8:7", "CONDITIONALS_BOUNDARY"))
	require.Error(t, err, "an operator that moved is not replaced blindly")
}

// A function counts as run by a test when a block that starts in its lines
// ran at least once; blocks of other packages and blocks counted zero do
// not count.
func TestParseProfile(t *testing.T) {
	funcs := []funcRange{{"p.go", "T.Fits", 7, 12}, {"p.go", "count", 14, 23}, {"q.go", "other", 1, 9}}
	profile := strings.Join([]string{
		"mode: set",
		"example.com/m/p/p.go:7.30,8.25 1 1",
		"example.com/m/p/p.go:14.30,16.10 2 0",
		"example.com/m/p/q.go:3.1,4.2 1 1",
		"example.com/m/pp/p.go:15.1,16.2 1 1",
		"",
	}, "\n")
	run, blocks, err := parseProfile(bufio.NewScanner(strings.NewReader(profile)), "example.com/m/p", funcs)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"p.go\x00T.Fits": true, "q.go\x00other": true}, run)
	require.Equal(t, map[block]bool{
		{"p.go", 7, 30, 8, 25}:   true,
		{"p.go", 14, 30, 16, 10}: false,
		{"q.go", 3, 1, 4, 2}:     true,
	}, blocks)

	for _, bad := range []string{"example.com/m/p/p.go 1 1\n", "example.com/m/p/p.go:1.2 1 1\n"} {
		_, _, err = parseProfile(bufio.NewScanner(strings.NewReader(bad)), "example.com/m/p", funcs)
		require.Error(t, err, bad)
	}
}

// A mutant runs against the tests that ran its block; in no block, those
// that ran its function; outside any function, all of them.
func TestTestsFor(t *testing.T) {
	a, b, c := testRef{"p", "TestA"}, testRef{"p", "TestB"}, testRef{"q", "TestC"}
	cov := &coverage{
		tests:     []testRef{a, b, c},
		funcsRun:  map[string][]testRef{"p.go\x00f": {a, b}},
		blocksRun: map[block][]testRef{{"p.go", 10, 20, 12, 5}: {b, c}},
		blocks:    []block{{"p.go", 10, 20, 12, 5}, {"p.go", 13, 2, 14, 3}},
	}
	at := func(line, col int, fn string) []testRef {
		return cov.testsFor(mutant{File: "p.go", Line: line, Col: col, Func: fn})
	}
	require.Equal(t, []testRef{b, c}, at(10, 20, "f"), "the block's first column, with another package's test")
	require.Equal(t, []testRef{b, c}, at(12, 4, "f"))
	require.Empty(t, at(13, 9, "f"), "a block no test ran")
	require.Equal(t, []testRef{a, b}, at(12, 5, "f"), "the end is not the block's")
	require.Equal(t, []testRef{a, b}, at(10, 19, "f"))
	require.Equal(t, cov.tests, at(1, 1, ""), "outside any function")
	require.Equal(t, "q.TestC", c.String())
}
