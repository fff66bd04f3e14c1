package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// One writer per session (docs/design.md, P3, invariants 4-7), on real processes:
// consumers sharing a group through rebalances, two groups that both see
// every prompt and wake, a paused executor whose lease ran out (the zombie
// crash window), and graceful and hurried shutdowns.

// consumerProc is a started consumer with what it logged once running.
type consumerProc struct {
	*proc
	owner       string // the owner ID it writes into claims
	metricsAddr string // where it serves /metrics
}

// startConsumer starts a consumer like b.start (a later --group in extra
// wins over the bundle's) and waits until it logs "consumer running".
func (b *testBundle) startConsumer(t *testing.T, name string, extra ...string) *consumerProc {
	t.Helper()
	p := b.start(t, name, "", extra...)
	line := p.waitLog(t, "consumer running", 60*time.Second)
	owner, _ := line["owner"].(string)
	addr, _ := line["metrics_addr"].(string)
	require.NotEmpty(t, owner, "consumer running: %v", line)
	require.NotEmpty(t, addr, "consumer running: %v", line)
	return &consumerProc{proc: p, owner: owner, metricsAddr: addr}
}

func (c *consumerProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig), "%s: sending %s", c.name, sig)
}

var metricsClient = &http.Client{Timeout: 10 * time.Second}

// metric sums the samples of the metric called name on the consumer's
// /metrics whose label set contains every one of labels (`key="value"`).
// A vector without samples counts 0.
func (c *consumerProc) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	res, err := metricsClient.Get("http://" + c.metricsAddr + "/metrics")
	require.NoError(t, err, "%s: scraping /metrics", c.name)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s /metrics: %s", c.name, body)
	var sum float64
	for line := range strings.Lines(string(body)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series, value := line[:i], line[i+1:]
		labelSet := ""
		if j := strings.IndexByte(series, '{'); j >= 0 {
			series, labelSet = series[:j], series[j:]
		}
		if series != name || !allIn(labelSet, labels) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		require.NoError(t, err, "%s: %q", c.name, line)
		sum += v
	}
	return sum
}

func allIn(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

const fencedWritesMetric = "promptline_fenced_writes_total"

// waitUntil polls cond (in the test goroutine, so cond may use require)
// every 20ms until it holds, failing the test after timeout with what.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(timeout, cond) {
		require.FailNow(t, fmt.Sprintf("not within %s: %s", timeout, what))
	}
}

// pollUntil polls cond every 20ms until it holds (true) or timeout passes
// (false).
func pollUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// openTxSQL counts the transactions open in the test's database, other than
// the caller's own session.
const openTxSQL = `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`

// freeze stops c with SIGSTOP at a moment when no transaction is open in
// the database, and only c writes there. A process stopped inside a
// transaction would keep its row locks (the claim, during a renewal) or the
// relay's advisory lock for as long as it is stopped, and the test's
// takeover (or every other relay) would wait on it: a real hazard of paused
// processes, but not the window this test is about. So: stop; let a
// statement already in flight finish server-side; if a transaction stays
// open, continue the process, wait for it to close, and stop it again.
func freeze(t *testing.T, b *testBundle, c *consumerProc) {
	t.Helper()
	noTx := func() bool { return b.count(t, openTxSQL) == 0 }
	for range 50 {
		c.signal(t, syscall.SIGSTOP)
		if pollUntil(300*time.Millisecond, noTx) {
			return
		}
		t.Logf("%s stopped inside a transaction; continuing it and trying again", c.name)
		c.signal(t, syscall.SIGCONT)
		waitUntil(t, 10*time.Second, "transactions of "+c.name+" close", noTx)
	}
	require.FailNow(t, "could not stop "+c.name+" outside a transaction")
}

// turnEventsByPrompt maps each prompt answered on session-events to its
// turn events by event ID (the relay publishes at least once; a repeat
// carries the same ID).
func turnEventsByPrompt(t *testing.T, r *topicReader) map[string]map[string]envelope.Event {
	t.Helper()
	out := map[string]map[string]envelope.Event{}
	for _, e := range r.events(t) {
		if !isTurn(e) {
			continue
		}
		for _, id := range e.MessageIDs {
			if out[id] == nil {
				out[id] = map[string]envelope.Event{}
			}
			out[id][e.ID] = e
		}
	}
	return out
}

// waitAllTurns waits until every prompt has a turn event.
func waitAllTurns(t *testing.T, r *topicReader, prompts []envelope.Prompt, timeout time.Duration) {
	t.Helper()
	var missing []string
	ok := pollUntil(timeout, func() bool {
		got := turnEventsByPrompt(t, r)
		missing = missing[:0]
		for _, p := range prompts {
			if len(got[p.MessageID]) == 0 {
				missing = append(missing, p.MessageID)
			}
		}
		return len(missing) == 0
	})
	require.True(t, ok, "after %s, %d of %d prompts have no turn event: %v", timeout, len(missing), len(prompts), missing)
}

// requireOneWriterOutcome checks the end state of a run where every prompt
// of prompts (all queued, no tools) was answered: each admitted once,
// answered by exactly one completed assistant message and one distinct
// turn.completed event; per session, promotion order is admission order,
// which is publish order; no claim is left.
func requireOneWriterOutcome(t *testing.T, b *testBundle, prompts []envelope.Prompt) {
	t.Helper()
	ctx := context.Background()
	require.Equal(t, len(prompts), b.count(t, `SELECT count(*) FROM inputs`), "every prompt admitted once")

	byPrompt := turnEventsByPrompt(t, b.events)
	published := 0
	for _, e := range b.events.events(t) {
		if isTurn(e) {
			published++
		}
	}
	for _, p := range prompts {
		evs := byPrompt[p.MessageID]
		require.Len(t, evs, 1, "one distinct turn event for %s: %v", p.MessageID, evs)
		for _, e := range evs {
			require.Equal(t, envelope.EventTurnCompleted, e.Type, "turn of %s: %+v", p.MessageID, e)
			require.Equal(t, []string{p.MessageID}, e.MessageIDs, "a queued prompt is a turn of its own")
		}
		require.Equal(t, 1, distinctIDs(b.events.admittedEvents(t, p.MessageID)), "one input.admitted event for %s", p.MessageID)
	}
	t.Logf("%d turn events published for %d prompts (%d repeats by the relay)", published, len(prompts), published-len(prompts))

	// Exactly one assistant message per input, and it is completed.
	rows, err := b.pool.Query(ctx, `
SELECT i.message_id, count(m.message_id), count(m.message_id) FILTER (WHERE m.status = 'completed')
FROM inputs i LEFT JOIN messages m ON m.role = 'assistant' AND i.message_id = ANY(m.answers)
GROUP BY i.message_id
HAVING count(m.message_id) <> 1 OR count(m.message_id) FILTER (WHERE m.status = 'completed') <> 1`)
	require.NoError(t, err)
	var msgID string
	var answers, completed int
	var wrong []string
	_, err = pgx.ForEachRow(rows, []any{&msgID, &answers, &completed}, func() error {
		wrong = append(wrong, fmt.Sprintf("%s: %d answers, %d completed", msgID, answers, completed))
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, wrong, "every input answered by exactly one completed assistant message")
	require.Equal(t, len(prompts), b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant'`), "no stray assistant message")

	// Per session: admission order is publish order (Kafka keeps the order
	// of a key; redeliveries are exact retries that keep their place), and
	// queue deliveries are promoted, so executed, in admission order.
	sent := map[string][]string{}
	for _, p := range prompts {
		sent[p.SessionID] = append(sent[p.SessionID], p.MessageID)
	}
	rows, err = b.pool.Query(ctx, `
SELECT session_id, array_agg(message_id ORDER BY admission_seq), array_agg(message_id ORDER BY promotion_seq),
       count(*) FILTER (WHERE promotion_seq IS NULL)
FROM inputs GROUP BY session_id`)
	require.NoError(t, err)
	var session string
	var byAdmission, byPromotion []string
	var unpromoted int
	sessions := 0
	_, err = pgx.ForEachRow(rows, []any{&session, &byAdmission, &byPromotion, &unpromoted}, func() error {
		sessions++
		require.Zero(t, unpromoted, "session %s: every input promoted", session)
		require.Equal(t, sent[session], byAdmission, "session %s: admission order is publish order", session)
		require.Equal(t, byAdmission, byPromotion, "session %s: promotion order is admission order", session)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, len(sent), sessions)

	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "no claim left")
}

// publishStream publishes prompts from..to-1 of a stream spread over
// sessions (prompt i goes to session i mod sessions); every third sleeps
// 20ms in the provider so that turns are in flight when the group
// rebalances.
func publishStream(t *testing.T, b *testBundle, prefix string, sessions, from, to int) []envelope.Prompt {
	t.Helper()
	var out []envelope.Prompt
	for i := from; i < to; i++ {
		text := fmt.Sprintf("prompt %d", i)
		if i%3 == 0 {
			text = "/sleep 20ms\n" + text
		}
		p := prompt(fmt.Sprintf("%s-%02d", prefix, i%sessions), text)
		b.send(t, p)
		out = append(out, p)
	}
	return out
}

// TestTwoConsumersOneGroupWithRebalance: consumers A and B share a group;
// mid-stream C joins (a forced rebalance) and A leaves with SIGTERM, while
// prompts keep coming and turns are in flight. Partitions move, runs on
// revoked partitions release with wakes; every prompt still runs exactly
// once, in order per session, and no claim is left.
func TestTwoConsumersOneGroupWithRebalance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sessions, total = 20, 200
	grace := 10 * time.Second
	flags := []string{"--shutdown-grace", grace.String()}

	a := b.startConsumer(t, "consumer-a", flags...)
	bb := b.startConsumer(t, "consumer-b", flags...)
	prompts := publishStream(t, b, "s-rebalance", sessions, 0, 70)

	// C joins: every member rejoins, partitions move while turns run.
	c := b.startConsumer(t, "consumer-c", flags...)
	prompts = append(prompts, publishStream(t, b, "s-rebalance", sessions, 70, 140)...)
	c.waitLog(t, "partitions assigned", 60*time.Second)

	// A leaves gracefully while prompts keep coming.
	t.Logf("consumer-a %s before SIGTERM: %v", fencedWritesMetric, a.metric(t, fencedWritesMetric))
	stopping := time.Now()
	a.signal(t, syscall.SIGTERM)
	prompts = append(prompts, publishStream(t, b, "s-rebalance", sessions, 140, total)...)
	st := a.waitExit(t, grace+10*time.Second)
	require.True(t, st.Success(), "consumer-a should stop cleanly on SIGTERM, it ended with %s", st)
	t.Logf("consumer-a exited %s after SIGTERM", time.Since(stopping).Round(time.Millisecond))
	require.Less(t, time.Since(stopping), grace+5*time.Second, "consumer-a exits within its grace (plus the relay's last pass)")

	waitAllTurns(t, b.events, prompts, 60*time.Second)
	requireOneWriterOutcome(t, b, prompts)
	for _, p := range []*consumerProc{bb, c} {
		// Any value is allowed: a run told to stop by a rebalance may meet a
		// fence; what matters is that nothing ran twice.
		t.Logf("%s %s: %v", p.name, fencedWritesMetric, p.metric(t, fencedWritesMetric))
	}
}

// TestTwoGroupsEachPromptRunsOnce: two consumer groups on one database and
// broker both receive every prompt and every wake. Admission by the second
// group sees exact retries, and the claim lets only one executor run each
// turn: each prompt is admitted once and answered once.
func TestTwoGroupsEachPromptRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sessions, total = 10, 50
	a := b.startConsumer(t, "consumer-g1", "--group", b.group+"-g1")
	c := b.startConsumer(t, "consumer-g2", "--group", b.group+"-g2")

	prompts := publishStream(t, b, "s-groups", sessions, 0, total)
	waitAllTurns(t, b.events, prompts, 60*time.Second)
	// Both groups have consumed every prompt: each process classified all
	// of them (admitted or duplicate).
	classified := func(p *consumerProc) float64 {
		return p.metric(t, "promptline_admissions_total", `outcome="admitted"`) +
			p.metric(t, "promptline_admissions_total", `outcome="duplicate"`)
	}
	waitUntil(t, 30*time.Second, "both groups consume every prompt", func() bool {
		return classified(a) >= total && classified(c) >= total
	})

	admitted := a.metric(t, "promptline_admissions_total", `outcome="admitted"`) +
		c.metric(t, "promptline_admissions_total", `outcome="admitted"`)
	duplicates := a.metric(t, "promptline_admissions_total", `outcome="duplicate"`) +
		c.metric(t, "promptline_admissions_total", `outcome="duplicate"`)
	require.Equal(t, float64(total), admitted, "each prompt admitted by exactly one of the groups")
	require.GreaterOrEqual(t, duplicates, float64(total), "the other group's admission saw an exact retry of each")
	requireOneWriterOutcome(t, b, prompts)
	for _, p := range []*consumerProc{a, c} {
		t.Logf("%s: admitted %v, duplicates %v, %s %v, turns %v, wakes coalesced/started %v/%v", p.name,
			p.metric(t, "promptline_admissions_total", `outcome="admitted"`),
			p.metric(t, "promptline_admissions_total", `outcome="duplicate"`),
			fencedWritesMetric, p.metric(t, fencedWritesMetric),
			p.metric(t, "promptline_turns_total"),
			p.metric(t, "promptline_wakes_total", `result="coalesced"`), p.metric(t, "promptline_wakes_total", `result="started"`))
	}
}

const (
	attemptStatesOfPromptSQL = `
SELECT coalesce(array_agg(a.state ORDER BY a.started_at), '{}') FROM attempts a
JOIN messages m ON m.message_id = a.assistant_message_id
WHERE $1 = ANY(m.answers)`
	// turnRowsOfPromptSQL counts turn events answering $1 in the outbox,
	// published or not: a row that is not there can never reach Kafka.
	turnRowsOfPromptSQL = `
SELECT count(*) FROM outbox
WHERE topic = 'session-events'
  AND convert_from(payload, 'UTF8')::jsonb ->> 'type' IN ('turn.completed', 'turn.failed')
  AND convert_from(payload, 'UTF8')::jsonb -> 'message_ids' ? $1`
)

func attemptStates(t *testing.T, b *testBundle, msgID string) []string {
	t.Helper()
	var states []string
	require.NoError(t, b.pool.QueryRow(context.Background(), attemptStatesOfPromptSQL, msgID).Scan(&states))
	return states
}

// TestZombieIsFenced kills crash window "zombie" (docs/design.md): an
// executor paused past its lease, then resumed. A is paused (SIGSTOP) in the middle of a provider call;
// its lease runs out; the test, standing in for recovery, takes the claim
// over by compare-and-swap and releases it with a wake, as recovery's
// ready/unknown decision does; B runs the next prompt of the session. Then
// A resumes: its provider call returns, and every write it attempts is
// fenced: no answer, no event, the attempt stays started, and A goes on
// running.
//
// B is in another consumer group than A. In A's group, B could not get a
// partition before the coordinator evicts the paused A (its 10s session
// timeout), and on resuming A would then lose its partitions, so a
// revocation would stop its run too. In its own group B starts at once, and
// A, resumed, still believes it owns every partition: only the fencing
// token stands between it and the session, which is the property under
// test.
func TestZombieIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const session = "s-zombie"
	lease := []string{"--lease", "1s"}

	a := b.startConsumer(t, "consumer-a", lease...)
	// Runs before startProc's cleanup (cleanups run last in, first out): a
	// stopped process would not see its SIGTERM.
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	p1 := prompt(session, "/sleep 4s\nslow")
	b.send(t, p1)

	// A holds the claim and is in the provider call.
	waitUntil(t, 30*time.Second, "consumer-a claims "+session+" and dispatches the attempt", func() bool {
		var owner string
		err := b.pool.QueryRow(ctx, `SELECT owner_id FROM claims WHERE session_id = $1`, session).Scan(&owner)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return owner == a.owner && slices.Equal(attemptStates(t, b, p1.MessageID), []string{"started"})
	})

	freeze(t, b, a)
	p2 := prompt(session, "after the takeover")
	b.send(t, p2)

	// A cannot renew while it is stopped: its lease runs out by the
	// database clock.
	waitUntil(t, 10*time.Second, "the lease of the stopped consumer expires", func() bool {
		var expired bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT expires_at <= now() FROM claims WHERE session_id = $1`, session).Scan(&expired))
		return expired
	})

	// Recovery's part: compare-and-swap takeover, then (decision ready or
	// unknown with inputs waiting) release with a wake, in one transaction.
	var old, taken ledger.Claim
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var ok bool
		var err error
		old, ok, err = ledger.Get(ctx, tx, session)
		require.NoError(t, err)
		require.True(t, ok, "the expired claim is there")
		require.Equal(t, a.owner, old.OwnerID)
		require.Equal(t, ledger.PhaseUnknown, old.Phase, "the attempt was dispatched")
		taken, err = ledger.Takeover(ctx, tx, old, "test-recovery", "test", time.Minute)
		require.NoError(t, err)
		require.Greater(t, taken.Token, old.Token, "the takeover bumps the fencing token")
		tag, err := tx.Exec(ctx, `DELETE FROM claims WHERE session_id = $1 AND fencing_token = $2`, session, taken.Token)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		wake, err := json.Marshal(envelope.Wake{SessionID: session, Reason: "test-takeover", At: time.Now().UTC()})
		require.NoError(t, err)
		return outbox.Insert(ctx, tx, outbox.Row{Topic: "wakes", Key: session, Payload: wake})
	}))

	// B keeps the default lease: a 1s lease under a loaded race build could
	// run out between renewals and fence B too.
	bb := b.startConsumer(t, "consumer-b", "--group", b.group+"-b")
	turn := b.events.waitTurn(t, p2.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, "echo: after the takeover", turn.Text)
	var p2Token int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT fencing_token FROM messages WHERE role = 'assistant' AND $1 = ANY(answers)`,
		p2.MessageID).Scan(&p2Token))
	require.Greater(t, p2Token, taken.Token, "P2 was answered under a claim newer than the takeover")

	// Keep A stopped until its provider call is due (4s after its intent,
	// by the database clock, plus a margin), so that on resuming it holds a
	// response to record, not just a lease to renew.
	waitUntil(t, 15*time.Second, "P1's provider call is due", func() bool {
		var due bool
		require.NoError(t, b.pool.QueryRow(ctx, `
SELECT now() - a.started_at > interval '4500 milliseconds' FROM attempts a
JOIN messages m ON m.message_id = a.assistant_message_id WHERE $1 = ANY(m.answers)`, p1.MessageID).Scan(&due))
		return due
	})
	// A resumes: the provider's answer and the next renewal are both due;
	// whichever writes first is fenced (a renewal that wins also cancels
	// the call), and A writes nothing.
	a.signal(t, syscall.SIGCONT)
	fenced := a.waitLog(t, "execution fenced: claim lost, stopping", 30*time.Second)
	require.Equal(t, session, fenced["session_id"])
	require.Equal(t, old.ExecutionID, fenced["execution_id"])
	require.EqualValues(t, old.Token, fenced["fencing_token"])
	// The counter is bumped right after the log line.
	waitUntil(t, 10*time.Second, "consumer-a counts its fenced write", func() bool {
		return a.metric(t, fencedWritesMetric) >= 1
	})
	t.Logf("consumer-a %s: %v; consumer-b: %v", fencedWritesMetric, a.metric(t, fencedWritesMetric), bb.metric(t, fencedWritesMetric))

	require.Zero(t, b.count(t, turnRowsOfPromptSQL, p1.MessageID), "no turn event for P1 was ever written")
	require.Empty(t, b.events.turnEvents(t, p1.MessageID), "no turn event for P1 on session-events")
	require.Equal(t, []string{"started"}, attemptStates(t, b, p1.MessageID), "P1's attempt is left for recovery, untouched")
	require.Equal(t, 1, b.count(t, assistantAnswering, p1.MessageID), "one assistant message for P1")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'pending'`, p1.MessageID), "P1's answer was not stored")
	require.Zero(t, b.count(t, `SELECT count(*) FROM message_parts WHERE message_id IN (SELECT message_id FROM messages WHERE role = 'assistant' AND $1 = ANY(answers))`,
		p1.MessageID), "no part of P1's answer was stored")
	require.Equal(t, 1, b.count(t, assistantAnswering, p2.MessageID), "P2 answered once")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p2.MessageID)), "one turn for P2")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1`, session), "the redeliveries to both groups were exact retries")
	require.True(t, a.running(), "a fenced execution stops; the consumer goes on")
}

// TestGracefulShutdownReleasesWithWake: SIGTERM while a slow turn runs and
// another prompt of the session waits behind it. Within the grace the turn
// completes; past it the turn is cut off and settled as failed
// (interrupted), never retried. Either way the claim is released with a
// wake in the same transaction, published before the process exits, and the
// next consumer runs the waiting prompt.
func TestGracefulShutdownReleasesWithWake(t *testing.T) {
	t.Parallel()
	t.Run("TurnCompletesWithinGrace", func(t *testing.T) {
		t.Parallel()
		testGracefulShutdown(t, "10s", "/sleep 2s\nslow", envelope.EventTurnCompleted, "", "succeeded", "completed")
	})
	t.Run("GraceOverInterruptsTurn", func(t *testing.T) {
		t.Parallel()
		// The attempt was dispatched when it was cut off: its outcome is
		// unknown, so it is settled as such and never sent again.
		testGracefulShutdown(t, "100ms", "/sleep 20s\nslow", envelope.EventTurnFailed, envelope.FailInterrupted, "unknown", "errored")
	})
}

func testGracefulShutdown(t *testing.T, grace, slowText, wantType, wantReason, wantAttempt, wantMessage string) {
	b := setup(t)
	const session = "s-graceful"
	slow, queued := prompt(session, slowText), prompt(session, "queued")

	a := b.startConsumer(t, "consumer-a", "--shutdown-grace", grace)
	b.send(t, slow)
	b.send(t, queued)
	waitUntil(t, 30*time.Second, "the slow turn runs with the queued prompt admitted behind it", func() bool {
		return slices.Equal(attemptStates(t, b, slow.MessageID), []string{"started"}) &&
			b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NULL`, queued.MessageID) == 1
	})

	stopping := time.Now()
	a.signal(t, syscall.SIGTERM)
	st := a.waitExit(t, 30*time.Second)
	require.True(t, st.Success(), "SIGTERM stops the consumer cleanly, it ended with %s", st)
	t.Logf("consumer-a exited %s after SIGTERM (grace %s)", time.Since(stopping).Round(time.Millisecond), grace)

	// What A left, read before anyone else runs.
	unpublished := b.count(t, `SELECT count(*) FROM outbox WHERE key = $1 AND published_at IS NULL`, session)
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session), "the claim is released")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1
  AND convert_from(payload, 'UTF8')::jsonb ->> 'reason' = 'released'`, session),
		"the release wrote a wake: the queued prompt waits")
	require.Equal(t, 1, b.count(t, turnRowsOfPromptSQL, slow.MessageID), "the slow turn was settled")
	require.Equal(t, []string{wantAttempt}, attemptStates(t, b, slow.MessageID))
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = $2`, slow.MessageID, wantMessage))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NULL`, queued.MessageID),
		"the queued prompt was not started during the shutdown")

	b.startConsumer(t, "consumer-b")
	next := b.events.waitTurn(t, queued.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, next.Type)
	require.Equal(t, "echo: queued", next.Text)
	first := b.events.waitTurn(t, slow.MessageID)
	require.Equal(t, wantType, first.Type)
	require.Equal(t, wantReason, first.Reason)
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, slow.MessageID)), "the slow prompt had one turn")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, queued.MessageID)), "the queued prompt had one turn")
	require.Equal(t, []string{wantAttempt}, attemptStates(t, b, slow.MessageID), "the slow prompt's attempt was never retried")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session))
	require.Equal(t, 1, b.count(t, assistantAnswering, slow.MessageID))
	require.Equal(t, 1, b.count(t, assistantAnswering, queued.MessageID))

	// Last, so that the rest is checked whatever this says: a graceful
	// stop hands over its wake (and the turn's event) itself, through its
	// relay, rather than leaving them for the next process's relay.
	require.Zero(t, unpublished,
		"rows of %s committed during the shutdown were still unpublished when consumer-a exited", session)
}

// TestSecondSIGTERMExitsAtOnce: a second SIGTERM during the grace exits at
// once, without waiting for the running turn: exit status 130 (the
// convention for "terminated by a signal", which main uses for the second
// one). The turn is left as a crash would leave it: its attempt started,
// its claim in phase unknown, for recovery.
func TestSecondSIGTERMExitsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-second-signal"
	long := prompt(session, "/sleep 60s\nlong")

	a := b.startConsumer(t, "consumer-a", "--shutdown-grace", "30s")
	b.send(t, long)
	waitUntil(t, 30*time.Second, "the long turn runs", func() bool {
		return slices.Equal(attemptStates(t, b, long.MessageID), []string{"started"})
	})

	a.signal(t, syscall.SIGTERM)
	// Once the first is handled: two SIGTERMs pending at once would merge
	// into one.
	a.waitLog(t, "consumer stopping", 30*time.Second)
	second := time.Now()
	a.signal(t, syscall.SIGTERM)
	st := a.waitExit(t, 5*time.Second)
	t.Logf("consumer-a exited %s after the second SIGTERM: %s", time.Since(second).Round(time.Millisecond), st)
	ws, ok := st.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Exited(), "the consumer exits by itself, it ended with %s", st)
	require.Equal(t, 130, ws.ExitStatus())
	require.Contains(t, a.stderr.String(), "consumer: second signal, exiting at once")

	require.Equal(t, []string{"started"}, attemptStates(t, b, long.MessageID), "the cut-off attempt stays for recovery")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND phase = 'unknown'`, session),
		"the claim stays for recovery")
}
