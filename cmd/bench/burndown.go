package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/kafkautil"
)

// errNoTripCounter: the server's connection cannot be proxied to count
// round trips (TLS, a Unix socket).
var errNoTripCounter = errors.New("round trips cannot be counted")

// clockTick is USER_HZ, the unit of the CPU times in /proc/PID/stat.
const clockTick = 10 * time.Millisecond

// tableWrites are one table's row writes over a run, from
// pg_stat_user_tables.
type tableWrites struct {
	Table    string `json:"table"`
	Inserted int64  `json:"inserted"`
	Updated  int64  `json:"updated"`
	Deleted  int64  `json:"deleted"`
	Left     int64  `json:"rows_left"`
}

// burnDownRun is one consumer process working off a pre-filled prompts
// topic.
type burnDownRun struct {
	PromptsPerSession int `json:"prompts_per_session"`
	Prompts           int `json:"prompts"`
	// OfferedRate, when set, is the rate the prompts were produced at
	// from the consumer's start (no backlog); 0 for a burn-down.
	OfferedRate float64 `json:"offered_rate,omitempty"`
	Turns       int64   `json:"turns"`
	Seconds     float64 `json:"seconds"`
	// TurnsPerSecond is turns from the process's start to the last turn
	// event read back.
	TurnsPerSecond float64 `json:"turns_per_second"`
	// ConsumerCPUMillisPerTurn is the consumer process's user + system
	// time (/proc/PID/stat) per turn.
	ConsumerCPUMillisPerTurn float64 `json:"consumer_cpu_ms_per_turn"`
	// PostgresCPUMillisPerTurn is the server's: the postmaster, its live
	// children and the children it reaped (cutime, cstime), per turn; -1
	// when the server's processes cannot be read (another machine).
	PostgresCPUMillisPerTurn float64 `json:"postgres_cpu_ms_per_turn"`
	// StatementsPerTurn are the top-level statements the server ran on
	// the run's database, those the client sent (pg_stat_statements;
	// BEGIN/COMMIT included), per turn; -1 without pg_stat_statements.
	StatementsPerTurn float64 `json:"statements_per_turn"`
	// NestedStatementsPerTurn are the statements run inside functions
	// (plpgsql) on top of those, per turn; -1 when not counted.
	NestedStatementsPerTurn float64 `json:"nested_statements_per_turn"`
	// CommitsPerTurn is the database's xact_commit delta per turn.
	CommitsPerTurn float64 `json:"commits_per_turn"`
	// WALBytesPerTurn is the server's WAL written over the run
	// (pg_current_wal_lsn before the consumer's start and after it
	// stopped), per turn: the whole cluster's, so the bench's own reads
	// of the statistics and autovacuum are in it; -1 when not read.
	WALBytesPerTurn float64 `json:"wal_bytes_per_turn"`
	// DeltasPerTurn are the messages on session-deltas per turn (live
	// deltas of a streaming provider); -1 when not read.
	DeltasPerTurn float64 `json:"deltas_per_turn"`
	// RoundTripsPerTurn are the requests the consumer waited on per turn
	// (roundtrips.go), counted only in a run through the counting proxy;
	// -1 otherwise.
	RoundTripsPerTurn float64 `json:"round_trips_per_turn"`
	// Tables are the row writes per table, for the ceiling.
	Tables []tableWrites `json:"tables"`
	// Statements are the top-level statements behind StatementsPerTurn,
	// most called first: where the goal of ≤ 8 per turn has to be won.
	Statements []statementUse `json:"statements,omitempty"`
	// Nested are the statements run inside functions (the turn's SQL
	// functions, the fence, the queue's head) behind
	// NestedStatementsPerTurn, most called first: where a function's time
	// goes. The same statement run by two functions is one entry.
	Nested []statementUse `json:"nested_statements,omitempty"`
	CPU    cpuUse         `json:"cpu"`
}

// statementUse is one normalised statement of pg_stat_statements: how
// often it ran per turn and its mean time.
type statementUse struct {
	Query       string  `json:"query"`
	PerTurn     float64 `json:"per_turn"`
	MeanMillis  float64 `json:"mean_ms"`
	NestedCalls float64 `json:"nested_per_turn,omitempty"` // statements its functions ran, per turn, when tracked
}

// ceilingResult is the turn ceiling: the rows the burn-down left, written
// again by plain batched statements.
type ceilingResult struct {
	Turns          int64   `json:"turns"`
	Rows           int64   `json:"rows"`
	Writers        int     `json:"writers"`
	Batch          int     `json:"batch"`
	Seconds        float64 `json:"seconds"`
	TurnsPerSecond float64 `json:"turns_per_second"`
	CPU            cpuUse  `json:"cpu"`
}

// burnDownResult is the burn-downs, the ceiling and their ratio.
type burnDownResult struct {
	One     burnDownRun   `json:"one_per_session"`
	Ten     burnDownRun   `json:"ten_per_session"`
	Ceiling ceilingResult `json:"turn_ceiling"`
	// Half is the cost of a turn at a steady load: prompts, one per
	// session, produced at half of One's rate from the consumer's start for
	// the latency runs' duration; nil when not run.
	Half *burnDownRun `json:"half_rate,omitempty"`
	// Trips is a smaller one-per-session burn-down through the proxy that
	// counts round trips (kept apart: the proxy costs the bench CPU and
	// each round trip some latency); nil when it could not run.
	Trips *burnDownRun `json:"round_trips_run,omitempty"`
	// Efficiency is the one-per-session burn-down / the ceiling.
	Efficiency float64 `json:"burn_down_to_ceiling"`
	// Tools is a one-per-session burn-down of half as many prompts whose
	// turns each call the echo tool once (toolTurnText): an agent's turn,
	// two provider steps and a call between them; nil when not run.
	Tools *burnDownRun `json:"tool_turns,omitempty"`
}

// toolTurnText makes the scripted provider's turn ask for one echo call,
// then answer its result: two steps and a tool call a turn.
const toolTurnText = `/tool echo {"text": "x"}`

// buildConsumer builds ./cmd/consumer into a temporary directory.
func buildConsumer(ctx context.Context, progress func(string, ...any)) (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "promptline-bench-consumer-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "consumer")
	progress("building the consumer")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/promptline/promptline/cmd/consumer").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build ./cmd/consumer: %w\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// measureBurnDown runs the burn-down with one prompt per session, then
// with ten, then the turn ceiling on the rows of the first.
func measureBurnDown(ctx context.Context, sc *scratchServer, n int, partitions int32, halfFor time.Duration, toolTurns bool, progress func(string, ...any)) (res burnDownResult, err error) {
	bin, cleanup, err := buildConsumer(ctx, progress)
	if err != nil {
		return res, err
	}
	defer cleanup()
	var dump []tableDump
	for _, per := range []int{1, 10} {
		progress("burn-down: %d prompts, %d per session, one consumer process", n, per)
		r, d, err := burnDownOnce(ctx, sc, bin, n, per, partitions, per == 1, false, promptText, 0)
		if err != nil {
			return res, fmt.Errorf("burn-down, %d per session: %w", per, err)
		}
		if per == 1 {
			res.One, dump = r, d
		} else {
			res.Ten = r
		}
	}
	if toolTurns {
		tn := max(1, n/2)
		progress("burn-down: %d prompts, 1 per session, each turn one echo call, one consumer process", tn)
		r, _, err := burnDownOnce(ctx, sc, bin, tn, 1, partitions, false, false, toolTurnText, 0)
		if err != nil {
			return res, fmt.Errorf("burn-down with a tool call a turn: %w", err)
		}
		res.Tools = &r
	}
	if halfFor > 0 {
		rate := res.One.TurnsPerSecond / 2
		hn := max(1, int(rate*halfFor.Seconds()))
		progress("cost per turn at half the burn-down: %d prompts, 1 per session, at %.0f/s, one consumer process", hn, rate)
		r, _, err := burnDownOnce(ctx, sc, bin, hn, 1, partitions, false, false, promptText, rate)
		if err != nil {
			return res, fmt.Errorf("cost per turn at half the burn-down: %w", err)
		}
		res.Half = &r
	}
	progress("turn ceiling: the burn-down's %d turns' rows by plain batched statements", res.One.Turns)
	if res.Ceiling, err = measureCeiling(ctx, sc, dump, res.One.Turns, int(partitions)); err != nil {
		return res, fmt.Errorf("turn ceiling: %w", err)
	}
	res.Efficiency = res.One.TurnsPerSecond / res.Ceiling.TurnsPerSecond
	tn := max(1, n/5)
	progress("round trips: %d prompts, 1 per session, through a counting proxy", tn)
	r, _, err := burnDownOnce(ctx, sc, bin, tn, 1, partitions, false, true, promptText, 0)
	switch {
	case errors.Is(err, errNoTripCounter):
		progress("round trips not counted: %v", err)
	case err != nil:
		return res, fmt.Errorf("round trips: %w", err)
	default:
		res.Trips = &r
	}
	return res, nil
}

// burnDownOnce pre-fills a fresh broker with n prompts of text, per to a
// session, starts one consumer process on a fresh database and times it
// from its start to the last turn event read back. With dump it also
// returns the rows the run left, for the ceiling. With a rate, the
// prompts are not pre-filled: they are produced at rate per second from
// the consumer's start (the cost of a turn at a steady load, not at a
// backlog).
func burnDownOnce(ctx context.Context, sc *scratchServer, bin string, n, per int, partitions int32, dump, countTrips bool, text string, rate float64) (run burnDownRun, dumped []tableDump, err error) {
	w, err := newWorkloadText(n, per, text)
	if err != nil {
		return run, nil, err
	}
	broker, err := startBroker(partitions)
	if err != nil {
		return run, nil, err
	}
	defer broker.Close()
	if rate <= 0 {
		if err := prefill(ctx, []string{broker.Addr()}, "prompts", w); err != nil {
			return run, nil, err
		}
	}
	db, err := sc.create(ctx, poolOpts{MaxConns: 2})
	if err != nil {
		return run, nil, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()

	statements := hasStatements(ctx, db)
	writes0, err := tableStats(ctx, db)
	if err != nil {
		return run, nil, err
	}
	commits0, err := commitCount(ctx, db)
	if err != nil {
		return run, nil, err
	}
	postmaster := postmasterPID(ctx, db)
	wal0, walOK := walLSN(ctx, db)
	dbURL := sc.dbURL(db.Name)
	var trips *tripCounter
	if countTrips {
		if trips, err = newTripCounter(sc); err != nil {
			return run, nil, fmt.Errorf("%w: %v", errNoTripCounter, err)
		}
		defer func() {
			if trips != nil {
				err = errors.Join(err, trips.close())
			}
		}()
		u, err := url.Parse(dbURL)
		if err != nil {
			return run, nil, err
		}
		u.Host = fmt.Sprintf("127.0.0.1:%d", trips.port())
		dbURL = u.String()
	}
	var turns atomic.Int64
	answered, stopReader, err := countTurns(broker.Addr(), w, &turns)
	if err != nil {
		return run, nil, err
	}
	defer stopReader()

	pg0, pgOK := postgresCPU(postmaster)
	cpu0 := sampleCPU()
	start := time.Now()
	p, err := startBenchProc(ctx, bin, "consumer", "--brokers", broker.Addr(), "--database-url", dbURL,
		"--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(partitions), "--group", "bench-burndown-"+db.Name,
		"--log-level", "info")
	if err != nil {
		return run, nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			err = errors.Join(err, p.stop())
		}
	}()
	paced := make(chan error, 1)
	if rate > 0 {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { paced <- producePaced(pctx, []string{broker.Addr()}, "prompts", w, rate) }()
	}
	// Until every prompt is answered; a paced producer that finished
	// leaves the wait to the answers.
	timeout := time.After(15 * time.Minute)
	for waiting := true; waiting; {
		select {
		case err := <-paced:
			if err != nil {
				return run, nil, err
			}
			paced = nil
		case <-answered:
			waiting = false
		case <-p.exited:
			return run, nil, fmt.Errorf("the consumer exited (%s):\n%s", p.cmd.ProcessState, tail(p.logs(), 20))
		case <-ctx.Done():
			return run, nil, ctx.Err()
		case <-timeout:
			return run, nil, errors.New("not every prompt was answered within 15 minutes")
		}
	}
	secs := time.Since(start).Seconds()
	consumerCPU, _ := procCPU(p.cmd.Process.Pid, false)
	pg1, _ := postgresCPU(postmaster)
	cpu1 := sampleCPU()
	// Stopping the process ends its connections, and a backend that ends
	// flushes its statistics: the counts below are complete.
	stopped = true
	if err := p.stop(); err != nil {
		return run, nil, err
	}
	n1, err := pollStable(ctx, func() (int64, error) { return commitCount(ctx, db) })
	if err != nil {
		return run, nil, err
	}
	walBytes := int64(-1)
	if walOK {
		walBytes = walSince(ctx, db, wal0)
	}
	writes1, err := tableStats(ctx, db)
	if err != nil {
		return run, nil, err
	}

	t := turns.Load()
	run = burnDownRun{
		PromptsPerSession: per, Prompts: n, OfferedRate: rate, Turns: t, Seconds: secs, TurnsPerSecond: float64(t) / secs,
		ConsumerCPUMillisPerTurn: msPer(consumerCPU, t), PostgresCPUMillisPerTurn: -1, StatementsPerTurn: -1, NestedStatementsPerTurn: -1,
		CommitsPerTurn: float64(n1-commits0) / float64(t), CPU: cpuBetween(cpu0, cpu1), RoundTripsPerTurn: -1,
		WALBytesPerTurn: -1, DeltasPerTurn: -1,
	}
	if d, err := topicMessages(broker.Addr(), "session-deltas"); err == nil && t > 0 {
		run.DeltasPerTurn = float64(d) / float64(t)
	}
	if walBytes >= 0 && t > 0 {
		run.WALBytesPerTurn = float64(walBytes) / float64(t)
	}
	if trips != nil {
		run.RoundTripsPerTurn = float64(trips.trips.Load()) / float64(t)
		err := trips.close()
		trips = nil
		if err != nil {
			return run, nil, fmt.Errorf("counting round trips: %w", err)
		}
	}
	if pgOK {
		run.PostgresCPUMillisPerTurn = msPer(pg1-pg0, t)
	}
	if statements {
		top, nested, err := statementCalls(ctx, db)
		if err != nil {
			return run, nil, err
		}
		run.StatementsPerTurn = float64(top) / float64(t)
		if nested >= 0 {
			run.NestedStatementsPerTurn = float64(nested) / float64(t)
		}
		if run.Statements, err = statementUses(ctx, db, t, true); err != nil {
			return run, nil, err
		}
		if nested >= 0 {
			if run.Nested, err = statementUses(ctx, db, t, false); err != nil {
				return run, nil, err
			}
		}
	}
	for name, w1 := range writes1 {
		w0 := writes0[name]
		tw := tableWrites{Table: name, Inserted: w1.Inserted - w0.Inserted, Updated: w1.Updated - w0.Updated,
			Deleted: w1.Deleted - w0.Deleted, Left: w1.Left}
		if tw.Inserted+tw.Updated+tw.Deleted > 0 {
			run.Tables = append(run.Tables, tw)
		}
	}
	sortTables(run.Tables)
	if dump {
		if dumped, err = dumpTables(ctx, db, run.Tables, ceilingBatch); err != nil {
			return run, nil, err
		}
	}
	return run, dumped, nil
}

// topicMessages is the number of messages in topic: the sum of its
// partitions' high-water marks (the bench's topics start empty).
func topicMessages(addr, topic string) (int64, error) {
	c, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("bench-topic-size"))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range parts {
		hwm, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		n += hwm
	}
	return n, nil
}

// walLSN is the server's current WAL insert position; false when it
// cannot be read (a standby, a role without the right).
func walLSN(ctx context.Context, db *scratchDB) (string, bool) {
	var lsn string
	if err := db.Pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return "", false
	}
	return lsn, true
}

// walSince is the WAL written since lsn, in bytes; -1 when not read.
func walSince(ctx context.Context, db *scratchDB, lsn string) int64 {
	var n int64
	if err := db.Pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", lsn).Scan(&n); err != nil {
		return -1
	}
	return n
}

func msPer(d time.Duration, turns int64) float64 {
	if turns == 0 {
		return 0
	}
	return float64(d.Microseconds()) / 1000 / float64(turns)
}

// pollStable reads f until two reads 200ms apart agree, at most 10s: the
// statistics of backends that just ended reach the shared counters with a
// short delay.
func pollStable(ctx context.Context, f func() (int64, error)) (int64, error) {
	last, err := f()
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		v, err := f()
		if err != nil {
			return 0, err
		}
		if v == last {
			return v, nil
		}
		last = v
	}
	return last, nil
}

// procCPU is a process's user + system time from /proc/PID/stat, with
// children it reaped when children is set.
func procCPU(pid int, children bool) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	// Fields after the command: state(3) ppid(4) ... utime(14) stime(15)
	// cutime(16) cstime(17).
	ticks := f[11] + f[12]
	if children {
		ticks += f[13] + f[14]
	}
	return time.Duration(ticks) * clockTick, nil
}

// procStat returns the numeric fields of /proc/PID/stat after the command
// name (index 0 is the state, which reads as 0).
func procStat(pid int) ([]int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	out := make([]int64, len(fields))
	for j, x := range fields {
		out[j], _ = strconv.ParseInt(x, 10, 64)
	}
	return out, nil
}

// postmasterPID is the server's postmaster: the parent of this
// connection's backend, when the server runs on this machine (0 when not:
// its /proc entry is then someone else's or absent, and the check that it
// is a postgres process fails).
func postmasterPID(ctx context.Context, db *scratchDB) int {
	var backend int
	if err := db.Pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	f, err := procStat(backend)
	if err != nil {
		return 0
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(int(f[1])) + "/comm")
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return 0
	}
	return int(f[1])
}

// postgresCPU is the server's CPU time so far: the postmaster's own, its
// reaped children's (every backend that ended) and its live children's.
func postgresCPU(postmaster int) (time.Duration, bool) {
	if postmaster == 0 {
		return 0, false
	}
	total, err := procCPU(postmaster, true)
	if err != nil {
		return 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil || int(f[1]) != postmaster {
			continue // not a child, or ended meanwhile (then counted in cutime)
		}
		total += time.Duration(f[11]+f[12]) * clockTick
	}
	return total, true
}

// hasStatements creates pg_stat_statements in db and resets its counts
// there; false when the server has not loaded the library (or the user
// may not create the extension).
func hasStatements(ctx context.Context, db *scratchDB) bool {
	if _, err := db.Pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false
	}
	_, err := db.Pool.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	return err == nil
}

// statementCalls are the statements run on db since hasStatements, the
// bench's own reads of the statistics excluded: top-level ones (sent by a
// client) and nested ones (run inside functions; -1 unless the server
// tracks them, pg_stat_statements.track = all).
func statementCalls(ctx context.Context, db *scratchDB) (top, nested int64, err error) {
	err = db.Pool.QueryRow(ctx, `
SELECT coalesce(sum(calls) FILTER (WHERE toplevel), 0)::bigint,
       CASE WHEN current_setting('pg_stat_statements.track') = 'all'
            THEN coalesce(sum(calls) FILTER (WHERE NOT toplevel), 0) ELSE -1 END::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_backend_pid%'`).Scan(&top, &nested)
	if err != nil {
		return 0, 0, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	return top, nested, nil
}

// statementUses lists the top-level statements (toplevel) or the
// statements run inside functions (not toplevel) run on db since
// hasStatements (the bench's own reads excluded), per turn of turns, most
// called first; the query text on one line, cut at 110 bytes.
func statementUses(ctx context.Context, db *scratchDB, turns int64, toplevel bool) ([]statementUse, error) {
	rows, err := db.Pool.Query(ctx, `
SELECT regexp_replace(query, '\s+', ' ', 'g'), sum(calls)::float8 / $1, sum(total_exec_time) / greatest(sum(calls), 1)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel = $2
  AND query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_backend_pid%'
GROUP BY 1 ORDER BY 2 DESC, 1`, float64(turns), toplevel)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	uses, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (statementUse, error) {
		var u statementUse
		err := r.Scan(&u.Query, &u.PerTurn, &u.MeanMillis)
		if len(u.Query) > 110 {
			u.Query = strings.ToValidUTF8(u.Query[:110], "") + "…"
		}
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	return uses, nil
}

// tableStats reads every table's row writes so far and its live rows.
func tableStats(ctx context.Context, db *scratchDB) (map[string]tableWrites, error) {
	rows, err := db.Pool.Query(ctx, `
SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_live_tup FROM pg_stat_user_tables
WHERE schemaname = 'public' AND relname NOT LIKE 'goose%'`)
	if err != nil {
		return nil, fmt.Errorf("reading table statistics: %w", err)
	}
	out := map[string]tableWrites{}
	for rows.Next() {
		var t tableWrites
		if err := rows.Scan(&t.Table, &t.Inserted, &t.Updated, &t.Deleted, &t.Left); err != nil {
			return nil, err
		}
		out[t.Table] = t
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// n_live_tup is an estimate; the ceiling needs the rows themselves.
	for name, t := range out {
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()).Scan(&t.Left); err != nil {
			return nil, fmt.Errorf("counting %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// measureBurnDownFigures runs the burn-downs and the ceiling, then the
// end-to-end latency at half of the one-per-session burn-down's rate.
func measureBurnDownFigures(ctx context.Context, sc *scratchServer, o *options, rep *report, progress func(string, ...any)) error {
	r, err := measureBurnDown(ctx, sc, o.burnDownPrompts, o.partitions, o.duration, o.burnDownToolTurns, progress)
	if err != nil {
		return err
	}
	rep.BurnDown = &r
	half := r.One.TurnsPerSecond / 2
	progress("latency at half of the burn-down: %.0f/s for %s", half, o.duration)
	l, err := measureLatency(ctx, sc, latencyOpts{
		Partitions: o.partitions, Rate: half, Duration: o.duration, Warmup: warmupFor(o.duration),
	})
	if err != nil {
		return fmt.Errorf("latency at half of the burn-down: %w", err)
	}
	rep.HalfLatency = &l
	if o.riverJobs > 0 {
		rv, err := measureRiver(ctx, sc, o.riverJobs, o.riverWorkers, progress)
		if err != nil {
			return err
		}
		rep.River, rep.RiverRatio = &rv, r.One.TurnsPerSecond/rv.JobsPerSecond
	}
	return nil
}

// printBurnDown prints the burn-down figures with their goals.
func printBurnDown(out io.Writer, rep *report) {
	b := rep.BurnDown
	if b == nil {
		return
	}
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	na := func(v float64, format string) string {
		if v < 0 {
			return "n/a"
		}
		return fmt.Sprintf(format, v)
	}
	one, ten := b.One, b.Ten
	total := -1.0
	if one.PostgresCPUMillisPerTurn >= 0 {
		total = one.ConsumerCPUMillisPerTurn + one.PostgresCPUMillisPerTurn
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "burn-down figure\tvalue\tgoal\tmet?\t")
	fmt.Fprintf(tw, "burn-down, %d prompts, 1 per session (turns/s)\t%.0f\t\t\t\n", one.Prompts, one.TurnsPerSecond)
	fmt.Fprintf(tw, "burn-down, %d prompts, 10 per session (turns/s)\t%.0f\t\t\t\n", ten.Prompts, ten.TurnsPerSecond)
	fmt.Fprintf(tw, "  the same, prompts/s (%.2f prompts per turn)\t%.0f\t\t\t\n", float64(ten.Prompts)/float64(max(1, ten.Turns)), float64(ten.Prompts)/ten.Seconds)
	fmt.Fprintf(tw, "turn ceiling (turns/s)\t%.0f\t\t\t\n", b.Ceiling.TurnsPerSecond)
	fmt.Fprintf(tw, "burn-down / turn ceiling\t%.2f\t≥ %.1f\t%s\t\n", b.Efficiency, goalCeilingRatio, met(b.Efficiency >= goalCeilingRatio))
	if rv := rep.River; rv != nil {
		fmt.Fprintf(tw, "River no-op burn-down, %d jobs, %d workers, fetch cooldown %g ms (jobs/s)\t%.0f\t\t\t\n", rv.Jobs, rv.Workers, rv.FetchCooldownMS, rv.JobsPerSecond)
		fmt.Fprintf(tw, "burn-down / River's\t%.2f\t≥ %.2f\t%s\t\n", rep.RiverRatio, goalRiverRatio, met(rep.RiverRatio >= goalRiverRatio))
	}
	fmt.Fprintf(tw, "consumer CPU per turn (ms)\t%.3f\t\t\t\n", one.ConsumerCPUMillisPerTurn)
	fmt.Fprintf(tw, "Postgres CPU per turn (ms)\t%s\t\t\t\n", na(one.PostgresCPUMillisPerTurn, "%.3f"))
	if beforeCPUMillisPerTurn > 0 {
		fmt.Fprintf(tw, "CPU per turn, consumer + Postgres (ms)\t%s\t≤ %.3f (¼ of %.3f before)\t%s\t\n", na(total, "%.3f"),
			beforeCPUMillisPerTurn/4, beforeCPUMillisPerTurn, met(total >= 0 && total <= beforeCPUMillisPerTurn/4))
	} else {
		fmt.Fprintf(tw, "CPU per turn, consumer + Postgres (ms)\t%s\t≤ ¼ of before\t-\t\n", na(total, "%.3f"))
	}
	fmt.Fprintf(tw, "statements per turn (sent by the client)\t%s\t≤ %d\t%s\t\n", na(one.StatementsPerTurn, "%.1f"), goalStatementsPerTurn,
		met(one.StatementsPerTurn >= 0 && one.StatementsPerTurn <= goalStatementsPerTurn))
	fmt.Fprintf(tw, "  and run inside functions (plpgsql), per turn\t%s\t\t\t\n", na(one.NestedStatementsPerTurn, "%.1f"))
	fmt.Fprintf(tw, "commits per turn\t%.2f\t\t\t\n", one.CommitsPerTurn)
	if h := b.Half; h != nil {
		hTotal := -1.0
		if h.PostgresCPUMillisPerTurn >= 0 {
			hTotal = h.ConsumerCPUMillisPerTurn + h.PostgresCPUMillisPerTurn
		}
		fmt.Fprintf(tw, "at %.0f/s (half the burn-down): CPU per turn, consumer + Postgres (ms)\t%s\t\t\t\n", h.OfferedRate, na(hTotal, "%.3f"))
		fmt.Fprintf(tw, "at %.0f/s (half the burn-down): statements per turn\t%s\t≤ %d\t%s\t\n", h.OfferedRate, na(h.StatementsPerTurn, "%.1f"),
			goalStatementsPerTurn, met(h.StatementsPerTurn >= 0 && h.StatementsPerTurn <= goalStatementsPerTurn))
		fmt.Fprintf(tw, "at %.0f/s (half the burn-down): commits per turn\t%.2f\t\t\t\n", h.OfferedRate, h.CommitsPerTurn)
	}
	fmt.Fprintf(tw, "WAL per turn (bytes, the whole server's)\t%s\t\t\t\n", na(one.WALBytesPerTurn, "%.0f"))
	if t := b.Tools; t != nil {
		tTotal := -1.0
		if t.PostgresCPUMillisPerTurn >= 0 {
			tTotal = t.ConsumerCPUMillisPerTurn + t.PostgresCPUMillisPerTurn
		}
		fmt.Fprintf(tw, "burn-down, %d prompts, 1 per session, one tool call a turn (turns/s)\t%.0f\t\t\t\n", t.Prompts, t.TurnsPerSecond)
		fmt.Fprintf(tw, "  its CPU per turn, consumer + Postgres (ms)\t%s\t\t\t\n", na(tTotal, "%.3f"))
		fmt.Fprintf(tw, "  its statements, commits per turn\t%s, %.2f\t\t\t\n", na(t.StatementsPerTurn, "%.1f"), t.CommitsPerTurn)
	}
	if b.Trips != nil {
		fmt.Fprintf(tw, "round trips per turn (%d prompts through a counting proxy)\t%.2f\t\t\t\n", b.Trips.Prompts, b.Trips.RoundTripsPerTurn)
	}
	if h := rep.HalfLatency; h != nil {
		fmt.Fprintf(tw, "end-to-end p50 (ms) at %.0f/s (half the burn-down)\t%.1f\t\t\t\n", h.OfferedRate, h.Turn.P50)
		fmt.Fprintf(tw, "end-to-end p99 (ms) at %.0f/s (half the burn-down)\t%.1f\t< %d\t%s\t\n", h.OfferedRate, h.Turn.P99, goalHalfP99Millis,
			met(h.Turn.P99 < goalHalfP99Millis && h.Missing == 0))
	}
	if l := rep.Latency; l.Sent > 0 {
		fmt.Fprintf(tw, "end-to-end p50 (ms) at %.0f/s\t%.1f\t\t\t\n", l.OfferedRate, l.Turn.P50)
		fmt.Fprintf(tw, "end-to-end p99 (ms) at %.0f/s\t%.1f\t< %d at 1000/s\t%s\t\n", l.OfferedRate, l.Turn.P99, goalP99Millis,
			met(l.Turn.P99 < goalP99Millis && l.OfferedRate >= 1000 && l.Missing == 0))
	}
	tw.Flush()

	runs := []burnDownRun{one, ten}
	if b.Tools != nil {
		runs = append(runs, *b.Tools)
	}
	if b.Half != nil {
		runs = append(runs, *b.Half)
	}
	for i, r := range runs {
		what := "burn-down"
		switch {
		case i == 2 && b.Tools != nil:
			what = "burn-down, one tool call a turn"
		case r.OfferedRate > 0:
			what = fmt.Sprintf("at %.0f/s offered (half the burn-down, produced from the consumer's start)", r.OfferedRate)
		}
		fmt.Fprintf(out, "%s, %d per session: %d prompts, %d turns in %.2fs from the consumer's start; CPU %.2f cores busy (bench %.2f); consumer %.3f, Postgres %s ms CPU per turn; %s statements (+ %s inside functions), %.2f commits, %s WAL bytes per turn\n",
			what, r.PromptsPerSession, r.Prompts, r.Turns, r.Seconds, r.CPU.Machine, r.CPU.Bench, r.ConsumerCPUMillisPerTurn,
			na(r.PostgresCPUMillisPerTurn, "%.3f"), na(r.StatementsPerTurn, "%.1f"), na(r.NestedStatementsPerTurn, "%.1f"), r.CommitsPerTurn, na(r.WALBytesPerTurn, "%.0f"))
		fmt.Fprintf(out, "  rows per turn (inserted / updated / deleted / left):")
		for _, t := range r.Tables {
			d := float64(max(1, r.Turns))
			fmt.Fprintf(out, " %s %.2f/%.2f/%.2f/%.2f;", t.Table, float64(t.Inserted)/d, float64(t.Updated)/d, float64(t.Deleted)/d, float64(t.Left)/d)
		}
		fmt.Fprintln(out)
		if len(r.Statements) > 0 {
			fmt.Fprintln(out, "  statements per turn, sent by the client (per turn, mean ms, statement):")
			for _, u := range r.Statements {
				if u.PerTurn < 0.01 {
					break
				}
				fmt.Fprintf(out, "    %5.2f %7.3f  %s\n", u.PerTurn, u.MeanMillis, u.Query)
			}
		}
		if len(r.Nested) > 0 {
			fmt.Fprintln(out, "  statements per turn, run inside functions (per turn, mean ms, statement):")
			for _, u := range r.Nested {
				if u.PerTurn < 0.01 {
					break
				}
				fmt.Fprintf(out, "    %5.2f %7.3f  %s\n", u.PerTurn, u.MeanMillis, u.Query)
			}
		}
	}
	c := b.Ceiling
	fmt.Fprintf(out, "turn ceiling: the %d rows the 1-per-session burn-down left (%d turns), %d writers, %d rows per statement and transaction, %.2fs; CPU %.2f cores busy\n",
		c.Rows, c.Turns, c.Writers, c.Batch, c.Seconds, c.CPU.Machine)
	if t := b.Trips; t != nil {
		fmt.Fprintf(out, "round trips: a burn-down of %d prompts, 1 per session, through a proxy counting the consumer's Syncs and simple Queries (each one request it waits on): %.2f per turn; that run %.0f turns/s, %s statements per turn\n",
			t.Prompts, t.RoundTripsPerTurn, t.TurnsPerSecond, na(t.StatementsPerTurn, "%.1f"))
	} else {
		fmt.Fprintln(out, "round trips per turn: not counted (the counting proxy needs a plain TCP connection to the server)")
	}
	if h := rep.HalfLatency; h != nil {
		fmt.Fprintf(out, "latency at half the burn-down (%.0f/s offered, %.0f/s achieved):\n", h.OfferedRate, h.AchievedRate)
		printLatencyDetail(out, h)
	}
}
