package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// ceilingBatch is the rows of one statement (and one transaction) of the
// turn ceiling.
const ceilingBatch = 500

// tableDump is one table's rows left by a burn-down, as JSON arrays of
// ceilingBatch rows each.
type tableDump struct {
	Table   string
	Rows    int64
	Batches [][]byte
}

func sortTables(ts []tableWrites) {
	slices.SortFunc(ts, func(a, b tableWrites) int {
		if a.Table < b.Table {
			return -1
		}
		if a.Table > b.Table {
			return 1
		}
		return 0
	})
}

// dumpTables reads the rows left in the tables the run wrote, parents
// before the tables whose foreign keys name them, so that the ceiling can
// insert them in that order.
func dumpTables(ctx context.Context, db *scratchDB, written []tableWrites, batch int) ([]tableDump, error) {
	var names []string
	for _, t := range written {
		if t.Left > 0 {
			names = append(names, t.Table)
		}
	}
	order, err := fkOrder(ctx, db, names)
	if err != nil {
		return nil, err
	}
	var out []tableDump
	for _, name := range order {
		d := tableDump{Table: name}
		rows, err := db.Pool.Query(ctx, fmt.Sprintf("SELECT row_to_json(t)::text FROM %s t", pgx.Identifier{name}.Sanitize()))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		var cur []byte
		n := 0
		flush := func() {
			if n > 0 {
				d.Batches = append(d.Batches, append(cur, ']'))
			}
			cur, n = nil, 0
		}
		for rows.Next() {
			var row string
			if err := rows.Scan(&row); err != nil {
				rows.Close()
				return nil, err
			}
			if n == 0 {
				cur = append(cur, '[')
			} else {
				cur = append(cur, ',')
			}
			cur = append(cur, row...)
			n++
			d.Rows++
			if n == batch {
				flush()
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		flush()
		out = append(out, d)
	}
	return out, nil
}

// fkOrder sorts tables so that a table comes after every table its
// foreign keys reference.
func fkOrder(ctx context.Context, db *scratchDB, names []string) ([]string, error) {
	rows, err := db.Pool.Query(ctx, `
SELECT c.conrelid::regclass::text, c.confrelid::regclass::text
FROM pg_constraint c WHERE c.contype = 'f' AND c.conrelid <> c.confrelid`)
	if err != nil {
		return nil, fmt.Errorf("reading foreign keys: %w", err)
	}
	deps := map[string][]string{}
	for rows.Next() {
		var child, parent string
		if err := rows.Scan(&child, &parent); err != nil {
			rows.Close()
			return nil, err
		}
		deps[child] = append(deps[child], parent)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(names)
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("foreign keys form a cycle through %s", n)
		case 2:
			return nil
		}
		state[n] = 1
		for _, p := range deps[n] {
			if slices.Contains(names, p) {
				if err := visit(p); err != nil {
					return err
				}
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// measureCeiling writes the dumped rows into a fresh database by plain
// batched statements, writers at once, one transaction per batch, table
// after table in foreign-key order: the rows a burn-down left, with no
// Kafka, no executor, no fence, no reads. Rows the run wrote and removed
// (claims) and updates (promotion, publication marks) are not repeated:
// the ceiling is the cost of the rows a turn leaves.
func measureCeiling(ctx context.Context, sc *scratchServer, dump []tableDump, turns int64, writers int) (res ceilingResult, err error) {
	db, err := sc.create(ctx, poolOpts{MaxConns: int32(writers)})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()
	c0 := sampleCPU()
	for _, d := range dump {
		sql := fmt.Sprintf("INSERT INTO %[1]s OVERRIDING SYSTEM VALUE SELECT * FROM json_populate_recordset(NULL::%[1]s, $1::json)",
			pgx.Identifier{d.Table}.Sanitize())
		work := make(chan []byte)
		wctx, cancel := context.WithCancelCause(ctx)
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for b := range work {
					if _, err := db.Pool.Exec(wctx, sql, string(b)); err != nil {
						cancel(fmt.Errorf("inserting into %s: %w", d.Table, err))
					}
				}
			})
		}
	send:
		for _, b := range d.Batches {
			select {
			case work <- b:
			case <-wctx.Done():
				break send
			}
		}
		close(work)
		wg.Wait()
		err := context.Cause(wctx)
		cancel(nil)
		if err != nil {
			return res, err
		}
		res.Rows += d.Rows
	}
	c1 := sampleCPU()
	secs := c1.at.Sub(c0.at).Seconds()
	return ceilingResult{Turns: turns, Rows: res.Rows, Writers: writers, Batch: ceilingBatch, Seconds: secs,
		TurnsPerSecond: float64(turns) / secs, CPU: cpuBetween(c0, c1)}, nil
}
