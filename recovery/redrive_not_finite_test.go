package recovery_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// A waiting input whose admitted_at is 'infinity' (a hand edit, a restore,
// a repair script: the column admits it) is a lost wake like any other: no
// clock makes it old enough, so a scan that asked for inputs admitted
// before the clock less RedriveAfter never found it and its prompt waited
// for good (P1). The plan shows it, Waiting and a held pass count it, and
// the pass wakes it once: the session's redrive mark holds it back on the
// next pass as it does any session, so it cannot loop, and the healthy
// lost wake beside it is woken too.
func TestInfiniteAdmissionRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "inf", "m-inf", "hi")
	b.exec(t, `UPDATE inputs SET admitted_at = 'infinity' WHERE message_id = 'm-inf'`)
	b.admit(t, "old", "m-old", "hi")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE message_id = 'm-old'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})

	plan, err := rec.Plan(ctx, nil)
	require.NoError(t, err)
	var sessions []string
	for _, l := range plan.LostWakes {
		sessions = append(sessions, l.SessionID)
	}
	require.Equal(t, []string{"old", "inf"}, sessions, "the pass's order: by oldest admission, 'infinity' last")
	js, err := json.Marshal(plan.LostWakes[1])
	require.NoError(t, err)
	require.Contains(t, string(js), `"oldest_waiting_admitted_at_not_finite":"infinity"`)
	var out strings.Builder
	recovery.WritePlan(&out, plan)
	require.Contains(t, out.String(), "(the oldest admitted at infinity)")
	waiting, err := rec.Waiting(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRedriven: 2}, waiting)

	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, p.Redriven)
	require.Equal(t, 1, b.wakes(t, "inf"), "the waiting prompt is woken")
	require.Equal(t, 1, b.wakes(t, "old"))
	p, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Redriven, "woken once per RedriveAfter, as any lost wake")
	require.Equal(t, 1, b.wakes(t, "inf"))
}

// A session whose redrive mark is 'infinity' was never redriven as far as
// any clock can tell: a scan that asked for a mark older than the clock
// less RedriveAfter skipped its lost wake for good. The pass wakes it and
// sets the mark to a time, so the next pass holds it back as usual.
func TestInfiniteRedriveMarkDoesNotHideALostWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.admit(t, "s", "m1", "hi")
			b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE message_id = 'm1'`)
			b.exec(t, `UPDATE sessions SET redriven_at = $1::timestamptz WHERE session_id = 's'`, value)
			b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})

			waiting, err := rec.Waiting(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRedriven: 1}, waiting)
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, p.Redriven)
			require.Equal(t, 1, b.wakes(t, "s"))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE session_id = 's' AND isfinite(redriven_at)`),
				"the mark is a time again")
			p, err = rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, p.Redriven)
		})
	}
}
