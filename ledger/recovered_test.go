package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// attemptRow writes a provider attempt of execution e in session s.
func (b *testBundle) attemptRow(t *testing.T, s, e, id string, state ledger.AttemptState, errText *string) {
	t.Helper()
	b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
			idempotency_key, fencing_token, request_hash, state, error)
		VALUES ($1, $2, $3, 'a', 1, 'p', $1, 1, '\x00', $4, $5)`, id, s, e, string(state), errText)
}

// callRow writes a tool call of attempt a, requested at at.
func (b *testBundle) callRow(t *testing.T, s, a, id string, idx int, class string, state ledger.CallState, at time.Time) {
	t.Helper()
	b.exec(t, `INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
			input, idempotency_key, fencing_token, state, requested_at, started_at)
		VALUES ($1, $2, $3, 'e1', $4, 'm-' || $1, 'echo', $5, '{}', 'k-' || $1, 1, $6, $7,
			CASE WHEN $6 = 'started' THEN now() END)`, id, a, s, idx, class, string(state), at)
}

func (b *testBundle) callState(t *testing.T, id string) (state string, output *string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT state, output FROM tool_calls WHERE call_id = $1`, id).Scan(&state, &output))
	return state, output
}

func (b *testBundle) attemptState(t *testing.T, id string) (state string, errText *string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT state, error FROM attempts WHERE attempt_id = $1`, id).Scan(&state, &errText))
	return state, errText
}

func (b *testBundle) inTx(t *testing.T, fn func(tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, pgdb.InTx(context.Background(), b.pool, fn))
}

func ptr(s string) *string { return &s }

// What recovery writes on the ledger's tables after a takeover, and the
// executor's interruption of a failed turn's calls.
func TestRecoveredWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RearmIdempotentCallsLeavesSideEffectingOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.session(t, "other", 0)
		b.attemptRow(t, "s", "e1", "a1", ledger.AttemptSucceeded, nil)
		b.attemptRow(t, "other", "e2", "a2", ledger.AttemptSucceeded, nil)
		now := time.Now()
		b.callRow(t, "s", "a1", "idem", 0, "idempotent", ledger.CallStarted, now)
		b.callRow(t, "s", "a1", "side", 1, "side_effecting", ledger.CallStarted, now)
		b.callRow(t, "s", "a1", "done", 2, "idempotent", ledger.CallSucceeded, now)
		b.callRow(t, "other", "a2", "elsewhere", 0, "idempotent", ledger.CallStarted, now)

		b.inTx(t, func(tx pgx.Tx) error {
			return ledger.RearmIdempotentCalls(ctx, tx, &ledger.RearmIdempotentCallsParams{SessionID: "s"})
		})
		for id, want := range map[string]ledger.CallState{
			"idem": ledger.CallRequested, "side": ledger.CallStarted, "done": ledger.CallSucceeded, "elsewhere": ledger.CallStarted,
		} {
			state, _ := b.callState(t, id)
			require.Equal(t, string(want), state, id)
		}
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = 'idem' AND started_at IS NOT NULL`))
	})

	t.Run("SettleRetriedAttemptOnlyWhileDeferred", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "deferred", ledger.AttemptRetryWait, ptr("rate limited"))
		b.attemptRow(t, "s", "e1", "started", ledger.AttemptStarted, nil)

		b.inTx(t, func(tx pgx.Tx) error {
			if err := ledger.SettleRetriedAttempt(ctx, tx, &ledger.SettleRetriedAttemptParams{AttemptID: "deferred"}); err != nil {
				return err
			}
			return ledger.SettleRetriedAttempt(ctx, tx, &ledger.SettleRetriedAttemptParams{AttemptID: "started"})
		})
		state, errText := b.attemptState(t, "deferred")
		require.Equal(t, string(ledger.AttemptFailed), state)
		require.Equal(t, "rate limited; sent again with the same idempotency key by recovery", *errText)
		state, _ = b.attemptState(t, "started")
		require.Equal(t, string(ledger.AttemptStarted), state, "only a deferred attempt is settled")
	})

	t.Run("SettleDeferredAttemptsOfTheExecutionOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "d1", ledger.AttemptRetryWait, nil)
		b.attemptRow(t, "s", "e1", "s1", ledger.AttemptStarted, nil)
		b.attemptRow(t, "s", "e0", "d0", ledger.AttemptRetryWait, nil)

		b.inTx(t, func(tx pgx.Tx) error {
			return ledger.SettleDeferredAttempts(ctx, tx, &ledger.SettleDeferredAttemptsParams{ExecutionID: "e1"})
		})
		state, errText := b.attemptState(t, "d1")
		require.Equal(t, string(ledger.AttemptFailed), state)
		require.Equal(t, "; not sent: continued by recovery", *errText)
		state, _ = b.attemptState(t, "s1")
		require.Equal(t, string(ledger.AttemptStarted), state)
		state, _ = b.attemptState(t, "d0")
		require.Equal(t, string(ledger.AttemptRetryWait), state, "another execution's attempt is left alone")
	})

	t.Run("ReconcileAttemptsMarksOpenOnesUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "started", ledger.AttemptStarted, nil)
		b.attemptRow(t, "s", "e1", "deferred", ledger.AttemptRetryWait, ptr("rate limited"))
		b.attemptRow(t, "s", "e1", "done", ledger.AttemptSucceeded, nil)
		b.attemptRow(t, "s", "e0", "earlier", ledger.AttemptStarted, nil)

		b.inTx(t, func(tx pgx.Tx) error {
			return ledger.ReconcileAttempts(ctx, tx, &ledger.ReconcileAttemptsParams{ExecutionID: "e1", Error: "outcome unknown"})
		})
		for id, want := range map[string]ledger.AttemptState{
			"started": ledger.AttemptUnknown, "deferred": ledger.AttemptUnknown, "done": ledger.AttemptSucceeded, "earlier": ledger.AttemptStarted,
		} {
			state, errText := b.attemptState(t, id)
			require.Equal(t, string(want), state, id)
			if want == ledger.AttemptUnknown {
				require.Equal(t, "outcome unknown", *errText, id)
			}
		}
	})

	t.Run("ReconcileCallsSettlesStartedUnknownRequestedInterruptedInRequestOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "a1", ledger.AttemptSucceeded, nil)
		b.attemptRow(t, "s", "e1", "a2", ledger.AttemptSucceeded, nil)
		at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
		// Inserted out of order: request time, then attempt, then index decide.
		b.callRow(t, "s", "a2", "late", 0, "side_effecting", ledger.CallRequested, at.Add(time.Second))
		b.callRow(t, "s", "a1", "second", 1, "idempotent", ledger.CallRequested, at)
		b.callRow(t, "s", "a2", "third", 0, "idempotent", ledger.CallStarted, at)
		b.callRow(t, "s", "a1", "first", 0, "side_effecting", ledger.CallStarted, at)
		b.callRow(t, "s", "a1", "done", 2, "idempotent", ledger.CallSucceeded, at)

		var settled []ledger.SettledCall
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			settled, err = ledger.ReconcileCalls(ctx, tx, &ledger.ReconcileCallsParams{SessionID: "s", Output: "outcome unknown"})
			return err
		})
		require.Equal(t, []ledger.SettledCall{
			{ID: "first", ModelCallID: "m-first", Tool: "echo", Class: "side_effecting", State: ledger.CallUnknown},
			{ID: "second", ModelCallID: "m-second", Tool: "echo", Class: "idempotent", State: ledger.CallInterrupted},
			{ID: "third", ModelCallID: "m-third", Tool: "echo", Class: "idempotent", State: ledger.CallUnknown},
			{ID: "late", ModelCallID: "m-late", Tool: "echo", Class: "side_effecting", State: ledger.CallInterrupted},
		}, settled)
		state, output := b.callState(t, "first")
		require.Equal(t, []any{string(ledger.CallUnknown), "outcome unknown"}, []any{state, *output})
		state, output = b.callState(t, "second")
		require.Equal(t, []any{string(ledger.CallInterrupted), "interrupted: never dispatched"}, []any{state, *output})
		state, _ = b.callState(t, "done")
		require.Equal(t, string(ledger.CallSucceeded), state)

		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			settled, err = ledger.ReconcileCalls(ctx, tx, &ledger.ReconcileCallsParams{SessionID: "s", Output: "outcome unknown"})
			return err
		})
		require.Empty(t, settled, "a second reconcile finds nothing open")
	})

	t.Run("InterruptCallsLeavesStartedOnesInRequestOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "a1", ledger.AttemptSucceeded, nil)
		at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
		b.callRow(t, "s", "a1", "later", 0, "side_effecting", ledger.CallRequested, at.Add(time.Second))
		b.callRow(t, "s", "a1", "second", 2, "idempotent", ledger.CallRequested, at)
		b.callRow(t, "s", "a1", "first", 1, "side_effecting", ledger.CallRequested, at)
		b.callRow(t, "s", "a1", "running", 0, "side_effecting", ledger.CallStarted, at)

		var settled []ledger.SettledCall
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			settled, err = ledger.InterruptCalls(ctx, tx, &ledger.InterruptCallsParams{SessionID: "s", Output: "interrupted: step_limit"})
			return err
		})
		require.Equal(t, []ledger.SettledCall{
			{ID: "first", ModelCallID: "m-first", Tool: "echo", Class: "side_effecting", State: ledger.CallInterrupted},
			{ID: "second", ModelCallID: "m-second", Tool: "echo", Class: "idempotent", State: ledger.CallInterrupted},
			{ID: "later", ModelCallID: "m-later", Tool: "echo", Class: "side_effecting", State: ledger.CallInterrupted},
		}, settled)
		state, output := b.callState(t, "first")
		require.Equal(t, []any{string(ledger.CallInterrupted), "interrupted: step_limit"}, []any{state, *output})
		state, _ = b.callState(t, "running")
		require.Equal(t, string(ledger.CallStarted), state, "a started call is not the executor's to interrupt")
	})

	t.Run("ClearClaimOnlyWithItsToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t, time.Minute)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		c := x.Claim()

		b.inTx(t, func(tx pgx.Tx) error {
			return ledger.ClearClaim(ctx, tx, &ledger.ClearClaimParams{SessionID: "s", Token: c.Token + 1})
		})
		_, ok, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.True(t, ok, "a claim holding another token is left alone")

		b.inTx(t, func(tx pgx.Tx) error {
			return ledger.ClearClaim(ctx, tx, &ledger.ClearClaimParams{SessionID: "s", Token: c.Token})
		})
		_, ok, err = ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("QuarantineClaimIsACompareAndSwap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, time.Minute)
		b.session(t, "s", 0)
		b.acquire(t, "s", "e1")
		b.expire(t, "s")
		scanned, _, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)

		quarantine := func(c ledger.Claim, reason string) bool {
			t.Helper()
			var q bool
			b.inTx(t, func(tx pgx.Tx) error {
				var err error
				q, err = ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: c, Reason: reason})
				return err
			})
			return q
		}
		changed := scanned
		changed.ExpiresAt = scanned.ExpiresAt.Add(-time.Second)
		require.False(t, quarantine(changed, "bad phase"), "a claim changed since the scan is skipped")
		changed = scanned
		changed.Token++
		require.False(t, quarantine(changed, "bad phase"), "a claim changed since the scan is skipped")
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`))

		require.True(t, quarantine(scanned, "bad phase"))
		require.False(t, quarantine(scanned, "another reason"), "a quarantined claim keeps its first reason")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason = 'bad phase' AND quarantined_at IS NOT NULL`))
	})

	t.Run("ReleaseClaimLiftsOnlyAQuarantinedClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t, time.Minute)
		for _, s := range []string{"s", "other"} {
			b.session(t, s, 0)
			b.acquire(t, s, "e-"+s)
			b.expire(t, s)
		}
		release := func(session string) (string, bool) {
			t.Helper()
			var reason string
			var found bool
			b.inTx(t, func(tx pgx.Tx) error {
				var err error
				reason, found, err = ledger.ReleaseClaim(ctx, tx, &ledger.ReleaseClaimParams{SessionID: session})
				return err
			})
			return reason, found
		}
		_, found := release("s")
		require.False(t, found, "a claim that is not quarantined is not found")
		_, found = release("nobody")
		require.False(t, found)
		for _, s := range []string{"s", "other"} {
			c, _, err := ledger.Get(ctx, b.pool, s)
			require.NoError(t, err)
			b.inTx(t, func(tx pgx.Tx) error {
				_, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: c, Reason: "bad phase of " + s})
				return err
			})
		}
		reason, found := release("s")
		require.True(t, found)
		require.Equal(t, "bad phase of s", reason, "the reason from before the release")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND quarantine_reason IS NULL AND quarantined_at IS NULL`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'other' AND quarantine_reason IS NOT NULL`), "another session's claim stays quarantined")
		_, found = release("s")
		require.False(t, found, "released once")
	})

	// Each function says what it was doing when its statement fails (the
	// texts recovery and the executor have always reported).
	t.Run("ErrorsSayWhatWasBeingDone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		for want, fn := range map[string]func(tx pgx.Tx) error{
			"re-arming idempotent tool calls": func(tx pgx.Tx) error {
				return ledger.RearmIdempotentCalls(ctx, tx, &ledger.RearmIdempotentCallsParams{SessionID: "s"})
			},
			"settling deferred attempt a1": func(tx pgx.Tx) error {
				return ledger.SettleRetriedAttempt(ctx, tx, &ledger.SettleRetriedAttemptParams{AttemptID: "a1"})
			},
			"settling deferred attempts": func(tx pgx.Tx) error {
				return ledger.SettleDeferredAttempts(ctx, tx, &ledger.SettleDeferredAttemptsParams{ExecutionID: "e1"})
			},
			"reconciling attempts": func(tx pgx.Tx) error {
				return ledger.ReconcileAttempts(ctx, tx, &ledger.ReconcileAttemptsParams{ExecutionID: "e1"})
			},
			"reconciling tool calls": func(tx pgx.Tx) error {
				_, err := ledger.ReconcileCalls(ctx, tx, &ledger.ReconcileCallsParams{SessionID: "s"})
				return err
			},
			"interrupting calls not run": func(tx pgx.Tx) error {
				_, err := ledger.InterruptCalls(ctx, tx, &ledger.InterruptCallsParams{SessionID: "s"})
				return err
			},
			"clearing claim": func(tx pgx.Tx) error {
				return ledger.ClearClaim(ctx, tx, &ledger.ClearClaimParams{SessionID: "s"})
			},
			"releasing the claim of s": func(tx pgx.Tx) error {
				_, _, err := ledger.ReleaseClaim(ctx, tx, &ledger.ReleaseClaimParams{SessionID: "s"})
				return err
			},
			"quarantining claim of s": func(tx pgx.Tx) error {
				_, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: ledger.Claim{SessionID: "s"}})
				return err
			},
		} {
			err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				// An aborted transaction fails every later statement.
				_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
				return fn(tx)
			})
			require.ErrorContains(t, err, want+": ")
			require.ErrorContains(t, err, "current transaction is aborted", want)
		}
	})
}

// What recovery reads of claims outside a decision: the expired claims a
// pass handles, and how many are quarantined.
func TestRecoveryReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// claims builds a claim per session: a expired first, b and c expired
	// at the same moment after it, live not expired, q expired before all
	// of them but quarantined.
	claims := func(t *testing.T, b *testBundle) {
		t.Helper()
		for _, s := range []string{"a", "b", "c", "live", "q"} {
			b.session(t, s, 0)
		}
		b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at, quarantine_reason)
			VALUES ('a', 'e-a', 'o-a', 3, 'unknown', 'm-a', now() - interval '2 minutes', NULL),
			       ('b', 'e-b', 'o-b', 1, 'ready', NULL, now() - interval '1 minute', NULL),
			       ('c', 'e-c', 'o-c', 1, 'ready', NULL, now() - interval '1 minute', NULL),
			       ('live', 'e-live', 'o', 1, 'ready', NULL, now() + interval '1 minute', NULL),
			       ('q', 'e-q', 'o', 1, 'ready', NULL, now() - interval '3 minutes', 'bad phase')`)
	}
	sessions := func(cs []ledger.Claim) []string {
		out := []string{}
		for _, c := range cs {
			out = append(out, c.SessionID)
		}
		return out
	}

	t.Run("ExpiredClaimsInThePassOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		claims(t, b)
		expired := func(p *ledger.ExpiredClaimsParams) []ledger.Claim {
			t.Helper()
			cs, err := ledger.ExpiredClaims(ctx, b.pool, p)
			require.NoError(t, err)
			return cs
		}

		all := expired(&ledger.ExpiredClaimsParams{Limit: 10})
		require.Equal(t, []string{"a", "b", "c"}, sessions(all), "by expiry, then session; neither live nor quarantined")
		a := all[0]
		require.WithinDuration(t, time.Now().Add(-2*time.Minute), a.ExpiresAt, 10*time.Second)
		a.ExpiresAt = time.Time{}
		require.Equal(t, ledger.Claim{SessionID: "a", ExecutionID: "e-a", OwnerID: "o-a", Token: 3, Phase: ledger.PhaseUnknown, AssistantMessageID: "m-a"}, a)
		require.Empty(t, all[1].AssistantMessageID, "no assistant message: empty")

		require.Equal(t, []string{"a", "b"}, sessions(expired(&ledger.ExpiredClaimsParams{Limit: 2})), "at most Limit")
		require.Equal(t, []string{"c"}, sessions(expired(&ledger.ExpiredClaimsParams{Limit: 10, SessionID: "c"})))
		require.Empty(t, expired(&ledger.ExpiredClaimsParams{Limit: 10, SessionID: "live"}))
		require.Equal(t, []string{"b", "c"}, sessions(expired(&ledger.ExpiredClaimsParams{Limit: 10, AfterExpiresAt: &all[0].ExpiresAt, AfterSessionID: "a"})))
		require.Equal(t, []string{"c"}, sessions(expired(&ledger.ExpiredClaimsParams{Limit: 10, AfterExpiresAt: &all[1].ExpiresAt, AfterSessionID: "b"})),
			"after a position, not a time: c expired with b")

		// In a transaction too: a plan reads in its snapshot.
		var inTx []ledger.Claim
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			inTx, err = ledger.ExpiredClaims(ctx, tx, &ledger.ExpiredClaimsParams{Limit: 10})
			return err
		})
		require.Equal(t, all, inTx)
	})

	t.Run("CountQuarantinedClaimsCountsOnlyQuarantinedOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		n, err := ledger.CountQuarantinedClaims(ctx, b.pool)
		require.NoError(t, err)
		require.Zero(t, n)
		claims(t, b)
		b.exec(t, `UPDATE claims SET quarantine_reason = 'stuck', quarantined_at = now() WHERE session_id = 'live'`)
		n, err = ledger.CountQuarantinedClaims(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, 2, n)
	})

	t.Run("ErrorsAreReported", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			// An aborted transaction fails every later statement.
			_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
			_, err := ledger.ExpiredClaims(ctx, tx, &ledger.ExpiredClaimsParams{Limit: 10})
			return err
		})
		require.ErrorContains(t, err, "scanning expired claims: ", "the text recovery has always reported")
		require.ErrorContains(t, err, "current transaction is aborted")
		err = pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
			_, err := ledger.CountQuarantinedClaims(ctx, tx)
			return err
		})
		require.ErrorContains(t, err, "current transaction is aborted", "the driver's, for the caller to wrap")
	})
}
