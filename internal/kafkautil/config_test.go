package kafkautil_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// TestConfigJoinGroupOutlivesTheRebalance: the broker answers a JoinGroup
// only when the rebalance's join phase ends, which may take up to the
// rebalance timeout (members that do not rejoin are awaited that long).
// Sarama bounds every response, JoinGroup included, by Net.ReadTimeout:
// shorter than the rebalance timeout, every member gives up its JoinGroup
// and joins again before the phase ends, and the group never settles (no
// partition assigned, nothing admitted; found by the chaos soak after a
// consumer was killed during a rebalance).
func TestConfigJoinGroupOutlivesTheRebalance(t *testing.T) {
	t.Parallel()
	c := kafkautil.NewConfig("test")
	require.Greater(t, c.Net.ReadTimeout, c.Consumer.Group.Rebalance.Timeout,
		"a JoinGroup must be able to wait for the whole rebalance")
	require.NoError(t, c.Validate())
}
