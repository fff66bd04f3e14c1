package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// slowMember is a member of a consumer group that keeps its session alive
// with heartbeats but never rejoins when a rebalance begins, as a Java
// consumer does while its application is busy between polls: the join
// phase of every rebalance then lasts the members' longest rebalance
// timeout.
type slowMember struct {
	broker   *sarama.Broker
	group    string
	memberID string
	gen      int32
}

// joinSlowMember joins group alone (so its join completes at once), takes
// the leader's part with an empty assignment, and heartbeats every 500ms
// until the test ends. rebalancing receives once a heartbeat is answered
// with REBALANCE_IN_PROGRESS: another member's JoinGroup is then waiting.
func joinSlowMember(t *testing.T, addr, group string, rebalanceTimeout time.Duration) (rebalancing <-chan struct{}) {
	t.Helper()
	cfg := kafkautil.NewConfig("slow-member") // go-metrics off, as every promptline client
	cfg.Net.ReadTimeout = 2 * rebalanceTimeout
	b := sarama.NewBroker(addr)
	require.NoError(t, b.Open(cfg))
	t.Cleanup(func() { _ = b.Close() })
	m := &slowMember{broker: b, group: group}

	join := func() *sarama.JoinGroupResponse {
		req := &sarama.JoinGroupRequest{
			Version: 5, GroupId: group, MemberId: m.memberID, ProtocolType: "consumer",
			SessionTimeout: 10000, RebalanceTimeout: int32(rebalanceTimeout / time.Millisecond),
		}
		require.NoError(t, req.AddGroupProtocolMetadata("range", &sarama.ConsumerGroupMemberMetadata{Topics: []string{"prompts"}}))
		resp, err := b.JoinGroup(req)
		require.NoError(t, err)
		return resp
	}
	resp := join()
	if resp.Err == sarama.ErrMemberIdRequired {
		m.memberID = resp.MemberId
		resp = join()
	}
	require.Equal(t, sarama.ErrNoError, resp.Err)
	m.memberID, m.gen = resp.MemberId, resp.GenerationId
	require.Equal(t, m.memberID, resp.LeaderId, "alone in the group, the slow member leads it")
	sync := &sarama.SyncGroupRequest{Version: 3, GroupId: group, GenerationId: m.gen, MemberId: m.memberID}
	require.NoError(t, sync.AddGroupAssignmentMember(m.memberID, &sarama.ConsumerGroupMemberAssignment{}))
	sresp, err := b.SyncGroup(sync)
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, sresp.Err)

	signal := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		signalled := false
		for {
			hb, err := b.Heartbeat(&sarama.HeartbeatRequest{Version: 3, GroupId: group, GenerationId: m.gen, MemberId: m.memberID})
			if err == nil && hb.Err == sarama.ErrRebalanceInProgress && !signalled {
				close(signal)
				signalled = true
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return signal
}

// A SIGTERM while the consumer waits in a JoinGroup (a rebalance whose
// join phase waits for a slow member, up to the rebalance timeout) must
// stop the process within its shutdown grace, cleanly: Sarama's Close
// sends the LeaveGroup on the coordinator's connection, behind the
// JoinGroup, and the broker answers a connection's requests in order.
func TestSigtermDuringALongJoinStopsWithinTheGrace(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, testPartitions).Addr()
	_, dbURL := testkit.Pool(t)
	b := &testBundle{addr: addr, dbURL: dbURL, group: "test-" + uuid.NewString()}
	rebalancing := joinSlowMember(t, addr, b.group, 2*time.Minute)

	p := b.start(t, "consumer", "", "--shutdown-grace", "2s")
	p.waitLog(t, "consumer running", 60*time.Second)
	select {
	case <-rebalancing: // the consumer's JoinGroup waits for the slow member
	case <-time.After(60 * time.Second):
		require.FailNow(t, "the consumer's join never began a rebalance", p.stderr.String())
	}

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	// The join alone would take the slow member's rebalance timeout (2
	// minutes; the consumer gives up its JoinGroup after 65s).
	st := p.waitExit(t, 25*time.Second)
	require.True(t, st.Success(), "SIGTERM should stop the consumer cleanly, it ended with %s\n%s", st, p.stderr.String())
	require.NotNil(t, findLog(p.stderr.String(),
		"consumer group still stopping when the shutdown grace ran out (a JoinGroup waits for a rebalance); exiting without it"),
		p.stderr.String())
	require.NotNil(t, findLog(p.stderr.String(), "consumer stopped"), p.stderr.String())
}
