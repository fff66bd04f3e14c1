package kafkautil_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
)

// A JoinGroup waits, by design, until every member of the group has
// joined again, up to the rebalance timeout: a broker that holds one is
// answering, not hung, and Hung must not say otherwise (/readyz would say
// not ready through every slow rebalance).
func TestBrokerWatchIsNotFooledByAWaitingJoinGroup(t *testing.T) {
	t.Parallel()
	b := testkit.Broker(t, 1)
	ctx := context.Background()
	w := kafkautil.NewBrokerWatch([]string{b.Addr()}, kafkautil.NewConfig("test"), &kafkautil.BrokerWatchConfig{
		Interval: 100 * time.Millisecond, HungAfter: 500 * time.Millisecond,
	})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(w.Stop)

	coordinator := func(id string) *sarama.Broker {
		cfg := kafkautil.NewConfig(id)
		w.Apply(cfg)
		c, err := sarama.NewClient([]string{b.Addr()}, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		coord, err := c.Coordinator("watch-group")
		require.NoError(t, err)
		return coord
	}
	join := func(coord *sarama.Broker, member string) (*sarama.JoinGroupResponse, error) {
		return coord.JoinGroup(&sarama.JoinGroupRequest{
			Version: 2, GroupId: "watch-group", MemberId: member, ProtocolType: "consumer",
			SessionTimeout: 8000, RebalanceTimeout: 8000,
			OrderedGroupProtocols: []*sarama.GroupProtocol{{Name: "range", Metadata: []byte{0, 0, 0, 0, 0, 0}}},
		})
	}

	// A first member joins and syncs, then goes silent (no heartbeat, no
	// rejoin): a second member's JoinGroup waits for it until its session
	// times out.
	first := coordinator("first")
	j, err := join(first, "")
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, j.Err)
	s, err := first.SyncGroup(&sarama.SyncGroupRequest{GroupId: "watch-group", GenerationId: j.GenerationId, MemberId: j.MemberId})
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, s.Err)

	joined := make(chan struct{})
	go func() {
		defer close(joined)
		_, _ = join(coordinator("second"), "")
	}()
	// Hung is asked every 20ms for 3s (six times HungAfter) while the
	// JoinGroup waits.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for checkUntil := time.Now().Add(3 * time.Second); time.Now().Before(checkUntil); <-tick.C {
		addr, d := w.Hung()
		require.Empty(t, addr, "a broker holding a JoinGroup for %s is reported hung", d)
	}
	select {
	case <-joined:
		t.Fatal("the second JoinGroup was answered within 3s: the test tested nothing")
	default:
	}
	<-joined
}

// Not parallel: the stress test's leak check counts every goroutine.
func TestBrokerWatchStartStop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		b := testkit.Broker(t, 1)
		w := kafkautil.NewBrokerWatch([]string{b.Addr()}, kafkautil.NewConfig("test"), &kafkautil.BrokerWatchConfig{
			Interval: time.Millisecond,
		})
		startstoptest.Stress(t, w)
	})
}
