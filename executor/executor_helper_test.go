package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
)

// newExecutor is executor.NewExecutor for a configuration the test knows
// to be valid.
func newExecutor(tb testing.TB, pool *pgxpool.Pool, cfg *executor.ExecutorConfig) *executor.Executor {
	tb.Helper()
	e, err := executor.NewExecutor(pool, cfg)
	require.NoError(tb, err)
	require.NoError(tb, e.Start(context.Background()))
	return e
}

// TestNewExecutorNamesAMissingField: a configuration the executor cannot
// run with is an error that names the field, not a panic.
func TestNewExecutorNamesAMissingField(t *testing.T) {
	t.Parallel()
	e, err := executor.NewExecutor(nil, &executor.ExecutorConfig{})
	require.Nil(t, e)
	require.EqualError(t, err, "executor: ExecutorConfig.Claims is required")

	claims := ledger.NewClaims(nil, &ledger.ClaimsConfig{OwnerID: "a"})
	e, err = executor.NewExecutor(nil, &executor.ExecutorConfig{Claims: claims, StopGrace: -time.Second})
	require.Nil(t, e)
	require.EqualError(t, err, "executor: ExecutorConfig.StopGrace must not be negative, got -1s")
	e, err = executor.NewExecutor(nil, &executor.ExecutorConfig{Claims: claims, FairShare: -time.Second})
	require.Nil(t, e)
	require.EqualError(t, err, "executor: ExecutorConfig.FairShare must not be negative, got -1s")
	e, err = executor.NewExecutor(nil, &executor.ExecutorConfig{Claims: claims})
	require.NoError(t, err, "no StopGrace: the default")
	e.StopNow()
}
