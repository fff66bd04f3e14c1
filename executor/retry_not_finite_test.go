package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
)

// refusingOnceProvider refuses its first request (not acted on, retry
// after a millisecond) and answers the next.
type refusingOnceProvider struct{ calls atomic.Int32 }

func (p *refusingOnceProvider) Complete(context.Context, provider.Request) (provider.Response, error) {
	if p.calls.Add(1) == 1 {
		return provider.Response{}, &provider.RetryAfterError{After: time.Millisecond, Err: errors.New("busy")}
	}
	return provider.Response{Text: "ok"}, nil
}

// A deferred attempt whose next_retry_at reads back as a time that is not
// a time (the deferral, run again after its commit's answer was lost,
// reads the row as committed, which a hand edit may have changed) is
// retried as any other: the executor's deferral used to fail on the
// clock's subtraction (a data error), and the turn, whose request had
// certainly not been acted on, was left to recovery. A trigger stands in
// for the edit: it makes the deferral itself store 'infinity'.
func TestDeferralReadsARetryTimeThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	_, err := b.pool.Exec(ctx, `
CREATE FUNCTION test_retry_at_infinity() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.next_retry_at := 'infinity'; RETURN NEW; END $$;
CREATE TRIGGER test_retry_at_infinity BEFORE UPDATE ON attempts
FOR EACH ROW WHEN (NEW.state = 'retry_wait') EXECUTE FUNCTION test_retry_at_infinity()`)
	require.NoError(t, err)

	p := &refusingOnceProvider{}
	e := b.executor(t, "a", p, 5*time.Second, 0)
	b.admit(t, "s", "m1", "hello")
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)

	require.Equal(t, int32(2), p.calls.Load(), "refused once, sent again")
	require.Equal(t, 1, b.answered(t, "m1"))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnCompleted))
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released, not left to expire")
}
