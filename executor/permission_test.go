package executor_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// countingEcho is the echo tool, counting runs.
type countingEcho struct {
	tools.Tool
	runs chan string
}

func (c countingEcho) Run(ctx context.Context, call tools.Call) (tools.Result, error) {
	c.runs <- call.IdempotencyKey
	return c.Tool.Run(ctx, call)
}

func TestPermissions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		*execBundle
		runs chan string
		exec func() *executor.Executor
		// execLogged is exec with its log to log.
		execLogged func(log *slog.Logger) *executor.Executor
		nudges     *nudgeLog
	}
	setupPerm := func(t *testing.T) *bundle {
		b := &bundle{execBundle: setupExec(t), runs: make(chan string, 16), nudges: &nudgeLog{}}
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(countingEcho{Tool: tools.NewEcho(), runs: b.runs}))
		// Each call builds a new executor: a restart, as far as the
		// session is concerned.
		b.execLogged = func(log *slog.Logger) *executor.Executor {
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "p"})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg, Logger: log,
				PermissionFunc: func(string) tools.Permission { return tools.Ask }, OnCommitFunc: b.nudges.onCommit(b.execBundle)})
			t.Cleanup(e.StopNow)
			return e
		}
		b.exec = func() *executor.Executor { return b.execLogged(nil) }
		return b
	}
	runOnce := func(t *testing.T, e *executor.Executor, session string) {
		done, err := e.Wake(ctx, session, 0)
		require.NoError(t, err)
		wait(t, done)
	}
	requestID := func(t *testing.T, b *bundle) string {
		var id string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id FROM permission_requests WHERE status = 'pending'`).Scan(&id))
		return id
	}
	reply := func(t *testing.T, b *bundle, id, r, msg string) admission.ReplyOutcome {
		out, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: id, Reply: r, Message: msg}, admission.Source{Topic: "permission-replies"})
		require.NoError(t, err)
		return out
	}
	// approved parks session s on an ask for echo, then admits its
	// approval (once), and returns the request's ID: the reply waits.
	approved := func(t *testing.T, b *bundle) string {
		b.admit(t, "s", "m1", `/tool echo {"text": "x"}`)
		runOnce(t, b.exec(), "s")
		id := requestID(t, b)
		require.Equal(t, admission.Admitted, reply(t, b, id, envelope.ReplyOnce, "").Outcome)
		return id
	}

	t.Run("AskParksTheSessionAndOnceResumesIt", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
		runOnce(t, b.exec(), "s")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "parked: the claim is released")
		id := requestID(t, b)
		asked := testkit.SessionEvents(t, b.pool, "s", envelope.EventPermissionAsked)
		require.Len(t, asked, 1)
		require.Equal(t, "echo", asked[0].Tool)
		require.Equal(t, id, asked[0].RequestID)
		require.Empty(t, b.runs, "the tool did not run")

		b.admit(t, "s", "m2", "queued behind the ask")
		runOnce(t, b.exec(), "s")
		require.Zero(t, b.answered(t, "m2"), "nothing else of a parked session runs")

		require.Equal(t, admission.Admitted, reply(t, b, id, envelope.ReplyOnce, "").Outcome)
		require.Equal(t, admission.Duplicate, reply(t, b, id, envelope.ReplyOnce, "").Outcome, "an exact retry of the reply")
		out := reply(t, b, id, envelope.ReplyReject, "")
		require.Equal(t, envelope.ReasonConflict, out.Reason, "another reply to an answered request")
		before := b.count(t, `SELECT max(id) FROM outbox`)
		runOnce(t, b.exec(), "s") // a new process: the request survived
		require.Len(t, b.runs, 1, "the tool ran once")
		// The reply's promotion and every commit after it nudge the relay.
		requireNudgedAfterEachCommit(t, b.execBundle, before, b.nudges.get())
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 2)
		require.Equal(t, []string{"m1"}, completed[0].MessageIDs)
		require.Equal(t, "tool results: echo: hi", completed[0].Text)
		require.Equal(t, []string{"m2"}, completed[1].MessageIDs, "the queued prompt ran after the resumed turn")
	})

	// A reply whose call is no longer requested (run by another
	// continuation of its turn) continues nothing: the turn went on
	// without it. The reply's input is consumed, and nothing is sent or
	// run again.
	t.Run("AReplyToACallNoLongerRequestedContinuesNothing", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		id := approved(t, b)
		_, err := b.pool.Exec(ctx, `UPDATE tool_calls SET state = 'succeeded', output = 'ran elsewhere', is_error = false,
			started_at = now(), finished_at = now() WHERE call_id = $1`, id)
		require.NoError(t, err)
		attempts := b.count(t, `SELECT count(*) FROM attempts`)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs, "the tool did not run again")
		require.Equal(t, attempts, b.count(t, `SELECT count(*) FROM attempts`), "no step was sent")
		require.Zero(t, b.count(t, `SELECT count(*) FROM waiting_inputs WHERE session_id = 's'`), "the reply is consumed")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the session is idle")
	})

	// The reply's admission, delivered again (a consumer killed before it
	// marked the reply's offset), runs while the parked turn resumes: it
	// locks the session row, then the request's row. The resume must not
	// lock the request before the session (a foreign key's check takes
	// the session row's key-share lock later), or the two deadlock and
	// the resume waits out deadlock_timeout, longer than a short lease.
	t.Run("ResumeAndAReplyAdmittedAgainDoNotDeadlock", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		id := approved(t, b)
		logs := testkit.NewSyncBuffer()
		e := b.execLogged(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		var (
			once     sync.Once
			admitted = make(chan error, 1)
		)
		executor.SetBeforePromote(e, func() {
			once.Do(func() {
				locked := make(chan struct{})
				go func() {
					admitted <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
						// What AdmitReply does, in its order.
						if _, err := tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE`); err != nil {
							return err
						}
						close(locked)
						// The resume goes ahead until it waits on a lock:
						// the session row (as it should) or, marking the
						// request first, a foreign key's check of it.
						if err := waitForALockWaiter(ctx, b.pool); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `SELECT status FROM permission_requests WHERE request_id = $1 FOR UPDATE`, id)
						return err
					})
				}()
				<-locked
			})
		})
		runOnce(t, e, "s")
		require.NoError(t, <-admitted)
		require.Len(t, b.runs, 1, "the tool ran once")
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted), 1)
		require.NotContains(t, logs.String(), "40P01", "the resume deadlocked with the reply's admission")
	})

	t.Run("AlwaysIsRememberedForTheSession", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "one"}`)
		runOnce(t, b.exec(), "s")
		require.Equal(t, admission.Admitted, reply(t, b, requestID(t, b), envelope.ReplyAlways, "").Outcome)
		runOnce(t, b.exec(), "s")
		b.admit(t, "s", "m2", `/tool echo {"text": "two"}`)
		runOnce(t, b.exec(), "s")
		require.Len(t, b.runs, 2)
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventPermissionAsked), 1, "asked once")
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 2)
		require.Equal(t, []string{"m2"}, completed[1].MessageIDs)
	})

	t.Run("RejectHaltsTheTurn", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "no"}`)
		runOnce(t, b.exec(), "s")
		b.admit(t, "s", "m2", "after")
		require.Equal(t, admission.Admitted, reply(t, b, requestID(t, b), envelope.ReplyReject, "").Outcome)
		before := b.count(t, `SELECT max(id) FROM outbox`)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs)
		requireNudgedAfterEachCommit(t, b.execBundle, before, b.nudges.get())
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, envelope.FailDeclined, failed[0].Reason)
		require.Equal(t, []string{"m1"}, failed[0].MessageIDs)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'interrupted'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "claim cleared")
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted), 1, "the session goes on with its next prompt")
	})

	// The declined call and the calls after it never run: each has its
	// outcome (interrupted) in the ledger, and its tool.completed says so,
	// before the turn's turn.failed; else a UI that listed them from
	// step.completed waits on them for good.
	t.Run("RejectAnnouncesTheInterruptedCalls", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", "/tool echo {\"text\": \"no\"}\n/tool echo {\"text\": \"nor\"}")
		runOnce(t, b.exec(), "s")
		require.Equal(t, admission.Admitted, reply(t, b, requestID(t, b), envelope.ReplyReject, "").Outcome)
		before := b.count(t, `SELECT max(id) FROM outbox`)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs)
		requireNudgedAfterEachCommit(t, b.execBundle, before, b.nudges.get())
		steps := testkit.SessionEvents(t, b.pool, "s", envelope.EventStepCompleted)
		require.Len(t, steps, 1)
		require.Len(t, steps[0].ToolCalls, 2)
		done := testkit.SessionEvents(t, b.pool, "s", envelope.EventToolCompleted)
		require.Len(t, done, 2, "one tool.completed per interrupted call")
		for i, c := range steps[0].ToolCalls {
			require.Equal(t, c.CallID, done[i].CallID)
			require.Equal(t, string(ledger.CallInterrupted), done[i].Outcome)
			require.Equal(t, c.ModelCallID, done[i].ModelCallID)
			require.Equal(t, c.Tool, done[i].Tool)
			require.Equal(t, c.Class, done[i].Class)
			require.Equal(t, steps[0].TurnID, done[i].TurnID)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'interrupted'`, c.CallID))
		}
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed), 1)
	})

	t.Run("RejectWithMessageIsFeedbackAndTheTurnContinues", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "x"}`)
		runOnce(t, b.exec(), "s")
		require.Equal(t, admission.Admitted, reply(t, b, requestID(t, b), envelope.ReplyReject, "use the other tool").Outcome)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs)
		completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
		require.Len(t, completed, 1)
		require.Equal(t, "tool results: echo: declined: use the other tool", completed[0].Text)
	})

	t.Run("ReplyKeyedToAnotherSessionIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "x"}`)
		runOnce(t, b.exec(), "s")
		out, err := b.admitter.AdmitReply(ctx, []byte("other"), envelope.PermissionReply{RequestID: requestID(t, b), Reply: envelope.ReplyOnce}, admission.Source{})
		require.NoError(t, err)
		require.Equal(t, envelope.ReasonKeyMismatch, out.Reason)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests WHERE status = 'pending'`), "nothing changed")
	})

	// A reply input whose request is gone by the time the run promotes it
	// (a repair by hand, say) is quarantined with its reason, and the run
	// goes on to the next input in the same promotion.
	t.Run("ReplyWithoutItsRequestIsQuarantined", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		id := approved(t, b)
		b.admit(t, "s", "m2", "next")
		_, err := b.pool.Exec(ctx, `DELETE FROM permission_requests WHERE request_id = $1`, id)
		require.NoError(t, err)
		before := b.count(t, `SELECT max(id) FROM outbox`)
		runOnce(t, b.exec(), "s")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE quarantine_reason = 'permission reply without a request of this session'`))
		require.Equal(t, 1, b.answered(t, "m2"), "the next input ran")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs q JOIN inputs p ON p.promoted_at = q.quarantined_at
			WHERE q.quarantine_reason IS NOT NULL AND p.message_id = 'm2'`), "promoted in the quarantine's transaction")
		// That promotion's turn.started, written through the executor's
		// plain write, nudges the relay as every commit does.
		requireNudgedAfterEachCommit(t, b.execBundle, before, b.nudges.get())
		require.Empty(t, b.runs, "the call was never run")
	})

	// A hard stop that cancels a write waiting on the database (here the
	// promotion of a reply, held by a lock on its request) is the stop's
	// doing, not a failure: it is not logged as an error, and the claim is
	// left to expire for recovery, since the cut write may have committed.
	t.Run("HardStopDuringAPromotionIsNotAnError", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		id := approved(t, b)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM permission_requests WHERE request_id = $1 FOR UPDATE`, id)
		require.NoError(t, err)
		var logs testkit.LogBuffer
		e := b.execLogged(testkit.Logger(t, &logs))
		_, err = e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
		}, 20*time.Second, 5*time.Millisecond, "the promotion waits for the request's row")
		e.StopNow()
		require.NoError(t, tx.Rollback(ctx))
		require.Contains(t, logs.String(), "promotion failed; its claim is left to expire for recovery")
		require.NotContains(t, logs.String(), "level=ERROR")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims`), "left to expire for recovery")
		require.Empty(t, b.runs)
	})

	// A run that finds nothing to promote after its claim (here the reply
	// it was woken for is quarantined by hand between the claim and the
	// promotion) releases the claim quietly: no error, no claim left, no
	// wake. The run is held after its claim by its own log line.
	t.Run("NothingToPromoteAfterTheClaimReleasesQuietly", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		approved(t, b)
		var logs testkit.LogBuffer
		h := &holdAt{Handler: slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}),
			msg: "claim acquired", once: &sync.Once{}, reached: make(chan struct{}), proceed: make(chan struct{})}
		e := b.execLogged(slog.New(h))
		before := b.count(t, `SELECT max(id) FROM outbox`)
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		select {
		case <-h.reached:
		case <-time.After(20 * time.Second):
			t.Fatal("the run never claimed")
		}
		_, err = b.pool.Exec(ctx, `UPDATE inputs SET quarantine_reason = 'repaired by hand', quarantined_at = now() WHERE kind = 'permission_reply'`)
		require.NoError(t, err)
		close(h.proceed)
		wait(t, done)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE id > $1`, before), "no event, no wake")
		require.Empty(t, b.runs, "nothing ran")
		require.NotContains(t, logs.String(), "level=ERROR")
	})

	// Invariant 14: a prompt whose message ID reads like an internal
	// input's is an ordinary prompt, and the real internal input still
	// reaches its request.
	t.Run("PromptTakingTheReplysIDIsAnOrdinaryPrompt", func(t *testing.T) {
		for _, tc := range []struct {
			name, session, reply string
		}{
			{"OtherSessionThenApproval", "x", envelope.ReplyOnce},
			{"SameSessionThenDecline", "s", envelope.ReplyReject},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setupPerm(t)
				b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
				runOnce(t, b.exec(), "s")
				id := requestID(t, b)
				hostile := "permission-reply-" + id // the request ID is public in permission.asked
				b.admit(t, tc.session, hostile, "not a reply")
				runOnce(t, b.exec(), tc.session)

				require.Equal(t, admission.Admitted, reply(t, b, id, tc.reply, "").Outcome)
				runOnce(t, b.exec(), "s")
				if tc.session != "s" {
					runOnce(t, b.exec(), tc.session)
				}
				if tc.reply == envelope.ReplyOnce {
					require.Len(t, b.runs, 1, "the tool ran")
					var texts []string
					for _, e := range testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted) {
						if slices.Equal(e.MessageIDs, []string{"m1"}) {
							texts = append(texts, e.Text)
						}
					}
					require.Equal(t, []string{"tool results: echo: hi"}, texts, "the resumed turn completed")
				} else {
					require.Empty(t, b.runs)
					failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
					require.Len(t, failed, 1)
					require.Equal(t, envelope.FailDeclined, failed[0].Reason)
				}
				require.Equal(t, 1, b.answered(t, hostile), "the prompt ran as a prompt")
				require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL`), "nothing quarantined")
				require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE promotion_seq IS NULL`), "nothing left waiting")
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND kind = 'permission_reply' AND session_id = 's'`,
					admission.ReplyTakenPrefix+id), "the reply's input took the ID no prompt can hold")
			})
		}
	})

	t.Run("ReplyWhoseInputIDsAreHeldIsAConflictNotASilentSuccess", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
		runOnce(t, b.exec(), "s")
		id := requestID(t, b)
		// Neither a prompt (that one) nor anything a sender can write (the
		// other): only a bug could hold both.
		b.admit(t, "s", admission.ReplyPrefix+id, "a prompt")
		_, err := b.pool.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, 's', '', '\x00', 'steer', false, 'continuation')`, admission.ReplyTakenPrefix+id)
		require.NoError(t, err)
		out := reply(t, b, id, envelope.ReplyOnce, "")
		require.Equal(t, admission.Conflict, out.Outcome)
		require.Equal(t, envelope.ReasonConflict, out.Reason)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests WHERE status = 'pending'`), "rolled back: the request still waits")
		require.Empty(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventPermissionReplied))
	})

	t.Run("NoPromptCanHoldTheTakenIDs", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{admission.ReplyTakenPrefix + "r", recovery.ContinuationTakenID("e")} {
			_, err := envelope.Decode([]byte("s"), mustJSON(map[string]string{"message_id": id, "session_id": "s", "text": "x"}), envelope.Limits{})
			var rej *envelope.RejectError
			require.ErrorAs(t, err, &rej, id)
			require.Equal(t, envelope.ReasonInvalidField, rej.Reason)
		}
	})

	t.Run("PromptTakingAContinuationsIDIsAnOrdinaryPrompt", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "recovery-continue-some-execution", "not a continuation")
		runOnce(t, b.exec(), "s")
		require.Equal(t, 1, b.answered(t, "recovery-continue-some-execution"), "the prompt ran as a prompt")
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL`), "nothing quarantined")
	})

	t.Run("ReplyToUnknownRequestIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		out := reply(t, b, "no-such-request", envelope.ReplyOnce, "")
		require.Equal(t, envelope.ReasonUnknownRequest, out.Reason)
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs`))
	})
}

// waitForALockWaiter polls until a backend of pool's database waits on a
// lock, for at most 10 s.
func waitForALockWaiter(ctx context.Context, pool *pgxpool.Pool) error {
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("no backend waits on a lock")
		}
	}
}
