package recovery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// Messages written before migration 00003 have no turn_id: each such
// assistant message was a turn of its own (no tool steps then), and the
// code names its turn by the message itself (transcript.ReadTurnID; the
// executor continues it, and recovery fails it, under that ID). Whether
// a newer assistant message is of the claim's turn must compare turns so
// named: two legacy messages are two turns, and a message written later
// for the rest of a legacy turn (turn_id = the legacy message's ID) is of
// that turn.
func TestLegacyTurnIsNamedByItsMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// legacy writes the rows of a session as a binary before migration
	// 00003 left them: user and assistant messages without turn_id, their
	// text parts, and an expired claim naming claimed in phase.
	legacy := func(t *testing.T, b *testBundle, claimed, phase string, msgs ...[3]string) {
		t.Helper()
		b.exec(t, `INSERT INTO sessions (session_id) VALUES ('s')`)
		for _, m := range msgs { // id, role, status
			b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, completed_at, execution_id, fencing_token)
				VALUES ($1, 's', $2, $3, CASE WHEN $3 <> 'pending' THEN now() END, 'e-old', 1)`, m[0], m[1], m[2])
			b.exec(t, `INSERT INTO message_parts (message_id, idx, kind, body) VALUES ($1, 0, 'text', 'text of ' || $1)`, m[0])
		}
		b.exec(t, `UPDATE messages SET answers = ARRAY['u1'] WHERE message_id = 'a1'`)
		b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at)
			VALUES ('s', 'e-old', 'old-binary', 1, $2, $1, now() - interval '1 second')`, claimed, phase)
		b.exec(t, `UPDATE sessions SET fencing_token = 1 WHERE session_id = 's'`)
	}
	decided := func(t *testing.T, b *testBundle) recovery.Record {
		t.Helper()
		recs := b.records(t, "s")
		require.Len(t, recs, 1)
		return recs[0]
	}

	// The claim names the first of two legacy turns; the second, newer,
	// failed. It is a newer turn, not the errored rest of the claim's:
	// the claim is superseded, and its completed turn is not failed again.
	t.Run("NewerLegacyTurnSupersedes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		legacy(t, b, "a1", "unknown",
			[3]string{"u1", "user", "completed"}, [3]string{"a1", "assistant", "completed"},
			[3]string{"u2", "user", "completed"}, [3]string{"a2", "assistant", "errored"})
		p := b.pass(t)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionSuperseded: 1}, p.Decisions,
			"a2 is a turn of its own, newer than a1's")
		require.Equal(t, "a2", decided(t, b).Evidence.SupersededBy)
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE convert_from(payload, 'UTF8') LIKE '%"turn.failed"%'`),
			"no turn is failed for an old, completed one")
	})

	// The claim names a legacy turn's message; the newer errored message
	// is the rest of that same turn, written after migration 00003 under
	// the legacy message's ID as its turn (as recovery writes the message
	// of a turn's second failure). The claim is that turn, decided by its
	// phase: reconciled, not cleared as superseded.
	t.Run("ErroredRestOfALegacyTurnDoesNotSupersede", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		legacy(t, b, "a1", "unknown",
			[3]string{"u1", "user", "completed"}, [3]string{"a1", "assistant", "errored"})
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, answers, turn_id, error, completed_at, execution_id, fencing_token)
			VALUES ('recovery-failed e-before', 's', 'assistant', 'errored', ARRAY['u1'], 'a1', 'outcome unknown', now(), 'e-before', 1)`)
		p := b.pass(t)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, p.Decisions,
			"the errored rest of a1's own turn supersedes nothing")
		require.Empty(t, decided(t, b).Evidence.SupersededBy)
	})

	// The flow of TestThirdFailureOfATurnIsReconciledNotSuperseded on a
	// turn whose message has no turn_id: the continuation of each
	// resolution dies inside the call, and recovery's errored message for
	// the second failure names the legacy message as its turn. The second
	// round is the operator's to resolve, and the third failure is
	// reconciled like the others.
	t.Run("ThirdFailureOfALegacyTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, call := b.unknownCall(t, "s")
		b.exec(t, `UPDATE messages SET turn_id = NULL WHERE message_id = $1`, c.assistant)

		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		b.crashDuringCall(t, "s")
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, b.pass(t).Decisions, "second failure")
		var turnID string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT turn_id FROM messages WHERE message_id LIKE 'recovery-failed %'`).Scan(&turnID))
		require.Equal(t, c.assistant, turnID, "the rest of a legacy turn is named after its message")

		_, err = b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 2)
		require.NoError(t, err, "the errored rest of its own turn does not supersede the call")
		b.crashDuringCall(t, "s")
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, b.pass(t).Decisions, "third failure")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, call.ID))
	})
}
