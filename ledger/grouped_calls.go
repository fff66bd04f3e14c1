package ledger

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The executor's common turn is two calls per session (migrations 00018,
// 00021): promptline_turn_first, its first step with its claim (or
// promptline_turn_next, a later turn's under the claim held), and
// promptline_turn_answer, its answer with the release; each an opening
// (the claim's checks and insert; the fence; the session's lock, the
// fence and the release) and then five or six statements of writes. When
// a group-commit flush holds two or more calls of one of them, each call
// sends only its opening, as a statement in its session's place, and the
// flush sends the writes of all of them as one statement at the end, one
// statement per table for all the sessions (migration 00024): measured on
// the burn-down and on the burst of ten thousand turns,
// docs/benchmarks.md ("Grouped calls").
//
// The openings keep the flush's order, the sessions' byte order, in which
// admission locks the sessions of its batch too: no deadlock between them
// (TestGroupedCallsKeepTheSessionsLockOrder). Each sender's result
// callback reads its own opening's row, which is its call's result (the
// claim's expiry; nothing; whether the claim was released). The writes are
// statements of the flush's one transaction, which commits or rolls back
// whole: a refusal, in an opening (a stale read, a lost claim, a write
// already applied) or in the writes (a key violated), rolls it back, and
// each session is then sent again alone, as its own call. The writes come after every lock the
// flush takes on its sessions' rows, and touch only rows of those
// sessions, which their executions alone write under the session's lock
// or the claim. Two things differ from the calls, neither read by
// anyone: an answer's release comes before its writes in the transaction,
// and rows of different sessions are interleaved in another order (outbox
// IDs, messages.seq), each session's in its own order.

// A groupedFunc is a function whose calls a flush may group.
type groupedFunc struct {
	name string
	// openSQL calls the opening, given the call's first open arguments;
	// its one row is the call's result.
	openSQL string
	open    int
	// shared are the indexes of opening arguments that writesSQL takes
	// too, first, as arrays; then come the call's arguments after the
	// opening's, as args says.
	shared    []int
	writesSQL string
	// args are the kinds of all the call's arguments.
	args []argKind
}

// argKind is what type a call's argument is, and how the grouped writes
// take it: a scalar as an array of the sessions' values, in the sessions'
// order; a list as the sessions' lists flattened, followed (argList) by
// the session of each element (1-based), or not (argRows: the outbox
// rows' columns, inserted in their order).
type argKind int

const (
	argText     argKind = iota // string → text[]
	argTextNull                // *string (an opening's only)
	argInt                     // int64 → bigint[]
	argIntNull                 // *int64 (an opening's only)
	argBytes                   // []byte → bytea[]
	argList                    // []string → text[], then integer[]
	argRows                    // []string → text[]
	argRowBytes                // [][]byte → bytea[]
)

// turnWritesGroupSQL writes the first steps of several turns, each after
// its opening: its claim, or its fence.
const turnWritesGroupSQL = `SELECT promptline_turn_writes_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`

// groupedFuncs are the functions whose calls are grouped.
var groupedFuncs = []groupedFunc{{
	name:      "promptline_turn_first",
	openSQL:   claimAsReadSQL,
	open:      8,
	shared:    []int{0, 1, 3, 6}, // session, execution, token, assistant message
	writesSQL: turnWritesGroupSQL,
	args: []argKind{
		argText, argText, argText, argInt, argInt, argText, argText, argRows, // the claim's; its waiting head is its own
		argList, argText, argText, argText, argText, argBytes, argText, argInt, argRows, argRows, argRowBytes,
	},
}, {
	// A later turn's first step under the claim held: the fence, then
	// the same writes as promptline_turn_first's.
	name:      "promptline_turn_next",
	openSQL:   fenceCallSQL,
	open:      7,
	shared:    []int{0, 1, 2, 5}, // session, execution, token, assistant message
	writesSQL: turnWritesGroupSQL,
	args: []argKind{
		argText, argText, argInt, argInt, argTextNull, argText, argIntNull, // the fence's
		argList, argText, argText, argText, argText, argBytes, argText, argInt, argRows, argRows, argRowBytes,
	},
}, {
	name:      "promptline_turn_answer",
	openSQL:   `SELECT promptline_finish_release($1, $2, $3, $4, $5, $6, $7)`,
	open:      7,
	writesSQL: `SELECT promptline_turn_answer_writes_group($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
	args: []argKind{
		argText, argText, argInt, argInt, argTextNull, argText, argIntNull, // the fence's
		argText, argInt, argInt, argText, argText, argText, argRows, argRows, argRowBytes,
	},
}}

// groupedCall is a queued transaction's one statement as a call of fn
// with args.
type groupedCall struct {
	fn   string
	args []any
}

// groupIndex is the index in groupedFuncs of t's call, or -1 when t is
// not one statement calling a groupedFunc with arguments it reads (a nil
// list, which the function would be given as NULL, is not read).
func (t *queuedTx) groupIndex() int {
	if t.call == nil || len(t.batch.QueuedQueries) != 1 {
		return -1
	}
	for f := range groupedFuncs {
		if groupedFuncs[f].name == t.call.fn && groupedFuncs[f].reads(t.call.args) {
			return f
		}
	}
	return -1
}

// reads says whether args are a call's arguments of the kinds g.args
// says, its outbox columns (after the opening's) of one length.
func (g *groupedFunc) reads(args []any) bool {
	if len(args) != len(g.args) {
		return false
	}
	rows := -1
	for i, k := range g.args {
		n, ok := 0, false
		switch a := args[i]; k {
		case argText:
			_, ok = a.(string)
		case argTextNull:
			_, ok = a.(*string)
		case argInt:
			_, ok = a.(int64)
		case argIntNull:
			_, ok = a.(*int64)
		case argBytes:
			_, ok = a.([]byte)
		case argList, argRows:
			var l []string
			l, ok = a.([]string)
			ok, n = ok && l != nil, len(l)
		case argRowBytes:
			var l [][]byte
			l, ok = a.([][]byte)
			ok, n = ok && l != nil, len(l)
		}
		if !ok {
			return false
		}
		if (k == argRows || k == argRowBytes) && i >= g.open {
			if rows >= 0 && n != rows {
				return false
			}
			rows = n
		}
	}
	return true
}

// writes is the statement of the writes of group's calls (each of g, in
// the sessions' order), with no result to read.
func (g *groupedFunc) writes(group []*queuedTx) *pgx.QueuedQuery {
	var args []any
	for _, i := range g.shared {
		args = append(args, g.column(group, i))
	}
	for i := g.open; i < len(g.args); i++ {
		args = append(args, g.column(group, i))
		if g.args[i] == argList {
			var of []int32
			for s, t := range group {
				for range t.call.args[i].([]string) {
					of = append(of, int32(s+1))
				}
			}
			args = append(args, of)
		}
	}
	return &pgx.QueuedQuery{SQL: g.writesSQL, Arguments: args}
}

// column is argument i of each of group's calls, as the grouped writes
// take it.
func (g *groupedFunc) column(group []*queuedTx, i int) any {
	switch g.args[i] {
	case argText:
		return columnOf[string](group, i)
	case argInt:
		return columnOf[int64](group, i)
	case argBytes:
		return columnOf[[]byte](group, i)
	case argList, argRows:
		var flat []string
		for _, t := range group {
			flat = append(flat, t.call.args[i].([]string)...)
		}
		return flat
	case argRowBytes:
		var flat [][]byte
		for _, t := range group {
			flat = append(flat, t.call.args[i].([][]byte)...)
		}
		return flat
	}
	panic(fmt.Sprintf("ledger: %s's grouped writes take no argument of kind %d", g.name, g.args[i]))
}

func columnOf[T any](group []*queuedTx, i int) []T {
	out := make([]T, len(group))
	for s, t := range group {
		out[s] = t.call.args[i].(T)
	}
	return out
}

// Groupable says whether a call of fn given args (its own, after the
// opening's, which the ledger gives) can have its writes grouped with
// others': the executor's tests hold the arguments it builds to the types
// the grouping reads, which would otherwise send every call whole without
// a word.
func Groupable(fn string, args []any) bool {
	for _, g := range groupedFuncs {
		if g.name != fn {
			continue
		}
		opening := make([]any, g.open) // of the opening's types
		for i, k := range g.args[:g.open] {
			opening[i] = map[argKind]any{argText: "", argTextNull: (*string)(nil), argInt: int64(0), argIntNull: (*int64)(nil),
				argRows: []string{}}[k]
		}
		return g.reads(append(opening, args...))
	}
	return false
}
