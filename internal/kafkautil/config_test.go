package kafkautil_test

import (
	"testing"
	"time"

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
	c := kafkautil.GroupConfig(kafkautil.NewConfig("test"))
	require.Greater(t, c.Net.ReadTimeout, c.Consumer.Group.Rebalance.Timeout,
		"a JoinGroup must be able to wait for the whole rebalance")
	require.NoError(t, c.Validate())
}

// TestConfigOtherRequestsGiveUpSoon: a producer, a partition consumer or
// an admin gives a request up soon after the longest a broker may take to
// answer it (a produce at acks=all: Producer.Timeout), not at the group's
// read timeout: a stopped broker would hold the relay's publishes that
// long (TestApacheStoppedLeaderFailsOver in cmd/consumer).
func TestConfigOtherRequestsGiveUpSoon(t *testing.T) {
	t.Parallel()
	c := kafkautil.NewConfig("test")
	require.Greater(t, c.Net.ReadTimeout, c.Producer.Timeout, "a produce at acks=all may wait Producer.Timeout")
	require.LessOrEqual(t, c.Net.ReadTimeout, 15*time.Second)
	g := kafkautil.GroupConfig(c)
	require.Equal(t, 15*time.Second, c.Net.ReadTimeout, "GroupConfig copies, it does not change its argument")
	require.Greater(t, g.Net.ReadTimeout, c.Net.ReadTimeout)
	require.NoError(t, c.Validate())
}

// The channel of a consumer of prompts holds at most bufferBytes of
// values counted at the largest value, one message at least and never
// more than ChannelBufferMax.
func TestChannelBufferFor(t *testing.T) {
	for _, c := range []struct{ buffer, maxValue, want int }{
		{kafkautil.BufferBytesDefault, 1 << 20, 32},
		{kafkautil.BufferBytesDefault, 1 << 10, kafkautil.ChannelBufferMax},
		{kafkautil.BufferBytesDefault, 32 << 10, kafkautil.ChannelBufferMax},
		{kafkautil.BufferBytesDefault, 64 << 10, 512},
		{1 << 20, 16 << 20, 1},
		{1, 1, 1},
		{1 << 30, 1 << 20, kafkautil.ChannelBufferMax},
	} {
		got := kafkautil.ChannelBufferFor(c.buffer, c.maxValue)
		if got != c.want {
			t.Errorf("ChannelBufferFor(%d, %d) = %d, want %d", c.buffer, c.maxValue, got, c.want)
		}
		if got > 1 && got*c.maxValue > c.buffer {
			t.Errorf("ChannelBufferFor(%d, %d) = %d holds %d bytes", c.buffer, c.maxValue, got, got*c.maxValue)
		}
	}
}
