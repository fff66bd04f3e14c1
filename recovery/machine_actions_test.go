package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
)

// victimApp is the application_name of the victim pool's backends.
const victimApp = "recovery-machine-victim"

// faultsInjected counts the transient errors the Transient action caused,
// by target and kind: a hunt fails if it never reached one, the default
// run if it reached none (non-vacuity).
var faultsInjected = map[string]*atomic.Int64{
	"executor/cancel": {}, "executor/terminate": {}, "recovery/cancel": {}, "recovery/terminate": {},
}

// Reply answers one pending permission request of the machine's sessions:
// approved once or always, declined, or declined with feedback for the
// model. Check then holds the tool to the answer.
func (m *recoveryMachine) Reply(t *rapid.T) {
	ctx := context.Background()
	rows, err := m.pool.Query(ctx, `SELECT request_id FROM permission_requests WHERE session_id = ANY($1) AND status = 'pending' ORDER BY request_id`, m.sessions)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) == 0 {
		return // nothing asked
	}
	id := rapid.SampledFrom(pending).Draw(t, "request")
	m.reply(t, id, rapid.SampledFrom([]string{"once", "always", "decline", "feedback"}).Draw(t, "reply"))
	if rapid.Bool().Draw(t, "run after the reply") {
		m.run(t, rapid.SampledFrom(m.sessions).Draw(t, "session"))
	}
}

func (m *recoveryMachine) reply(t *rapid.T, id, how string) {
	r := envelope.PermissionReply{RequestID: id, Reply: envelope.ReplyOnce}
	switch how {
	case "always":
		r.Reply = envelope.ReplyAlways
	case "decline":
		r.Reply = envelope.ReplyReject
	case "feedback":
		r.Reply, r.Message = envelope.ReplyReject, "not that, try another way"
	}
	out, err := m.admitter.AdmitReply(context.Background(), nil, r, admission.Source{Topic: "permission-replies"})
	if err != nil {
		t.Fatal(err)
	}
	if out.Outcome != admission.Admitted {
		t.Fatalf("the reply to pending request %s was not admitted: %+v", id, out)
	}
}

// Steer sends a steer while a turn of the session runs (held at the
// provider), then lets the turn go on to its end.
func (m *recoveryMachine) Steer(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	hold, held := m.holdAt("provider")
	defer m.unhold()
	e := m.executor("steered")
	defer e.StopNow()
	done, err := e.Wake(context.Background(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
		m.admit(t, s, rapid.SampledFrom([]string{"steer", "/tool idem {}"}).Draw(t, "steer text"), envelope.DeliverySteer)
		close(hold)
	case <-done:
		// Nothing ran: the steer arrives at an idle session.
		m.admit(t, s, "steer", envelope.DeliverySteer)
		return
	case <-time.After(20 * time.Second):
		t.Fatal("the run neither reached the provider nor finished")
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a steered run did not finish")
	}
}

// Transient makes one statement of an executor or of a recovery pass fail
// with a transient database error: the backend is cancelled (statement
// canceled, 57014) or terminated (pg_terminate_backend, 57P01) while it
// waits on a row lock that the machine holds. Transient errors are retried
// and never quarantine anything (invariant 13): Check fails on any
// quarantined row, and finish on work that never completed.
func (m *recoveryMachine) Transient(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	kind := rapid.SampledFrom([]string{"cancel", "terminate"}).Draw(t, "kind")
	ctx := context.Background()
	if rapid.Bool().Draw(t, "recovery") {
		// A recovery decision: the claim expired, its session row locked
		// (recovery locks it before deciding).
		var claimed bool
		if err := m.pool.QueryRow(ctx, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = $1 RETURNING true`, s).Scan(&claimed); errors.Is(err, pgx.ErrNoRows) {
			return // nothing to recover
		} else if err != nil {
			t.Fatal(err)
		}
		release := m.lockRow(t, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, s)
		errs := make(chan error, 1)
		go func() {
			_, err := m.victimRec.RunOnce(ctx)
			errs <- err
		}()
		hit := m.interrupt(t, kind, errs)
		release()
		if hit {
			faultsInjected["recovery/"+kind].Add(1)
			<-errs // the pass reports its error or leaves the claim for the next pass
		}
		return
	}
	// An executor's write: after the provider answered or a tool ran, the
	// claim row is locked, so the next write's fence waits on it; or the
	// attempts table is locked, so the next provider attempt's intent waits
	// (the step before it ended: the claim is left in the phase that step
	// set, continue or ready, for recovery to decide).
	where := rapid.SampledFrom([]string{"start", "provider", "idem", "side"}).Draw(t, "where")
	lock := `SELECT 1 FROM claims WHERE session_id = $1 FOR UPDATE`
	if where == "start" || rapid.Bool().Draw(t, "lock attempts") {
		lock = `LOCK TABLE attempts IN SHARE MODE`
	}
	e := m.executorOn(m.victim, "victim")
	defer e.StopNow()
	var release func()
	if where == "start" {
		release = m.lockRow(t, lock)
	}
	var hold, held chan struct{}
	if where != "start" {
		hold, held = m.holdAt(where)
		defer m.unhold()
	}
	done, err := e.Wake(ctx, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if where != "start" {
		select {
		case <-held:
		case <-done:
			return // nothing to run
		case <-time.After(20 * time.Second):
			t.Fatal("the run neither reached its call nor finished")
		}
		if lock == `LOCK TABLE attempts IN SHARE MODE` {
			release = m.lockRow(t, lock)
		} else {
			release = m.lockRow(t, lock, s)
		}
		close(hold)
	}
	finished := make(chan error, 1)
	go func() {
		<-done
		finished <- nil
	}()
	hit := m.interrupt(t, kind, finished)
	release()
	if hit {
		faultsInjected["executor/"+kind].Add(1)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a run interrupted by a transient error did not finish")
	}
}

// lockRow holds a row lock from another connection until release.
func (m *recoveryMachine) lockRow(t *rapid.T, sql string, args ...any) (release func()) {
	ctx := context.Background()
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// interrupt waits for a victim backend to wait on a lock, and cancels or
// terminates it; false when the work ended (ended) without waiting.
func (m *recoveryMachine) interrupt(t *rapid.T, kind string, ended <-chan error) bool {
	fn := map[string]string{"cancel": "pg_cancel_backend", "terminate": "pg_terminate_backend"}[kind]
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := m.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM (SELECT %s(pid) AS hit FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock') x WHERE hit`, fn), victimApp).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return true
		}
		select {
		case err := <-ended:
			if err != nil {
				t.Logf("ended without waiting on the lock: %v", err)
			}
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	t.Fatal("no victim backend waited on the lock")
	return false
}
