//go:build apachekafka

package main

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// TestApacheBrokerFailure runs a consumer on a three-node Apache Kafka
// cluster, its topics created by the consumer with replication factor 3
// (the brokers' min.insync.replicas is 2), prompts produced at acks=all
// with idempotence all along, and turns running, through two faults:
//
//  1. SIGKILL of the group's coordinator, which leads prompts partitions
//     in use, restarted on its data a while later;
//  2. SIGSTOP of the group's coordinator for longer than the consumer's
//     session timeout (10s), then SIGCONT.
//
// Every acknowledged prompt is admitted once and answered by one turn;
// every outbox row (events, wakes) is published and every session event is
// in the topic; /readyz and promptline_ready show the outage of both
// faults and the recovery from both. The stalls (longest time without an admission on the
// partitions the fault touched; without a session event arriving) are
// logged for docs/reliability.md.
func TestApacheBrokerFailure(t *testing.T) {
	b, k := apacheSetup(t, 3)
	flags := []string{"--replication-factor", "3", "--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s"}
	c := b.start(t, "consumer", "", flags...)
	metricsAddr, _ := c.waitLog(t, "consumer running", 3*time.Minute)["metrics_addr"].(string)
	require.NotEmpty(t, metricsAddr)
	ready := sampleReady(t, metricsAddr)
	r := b.connectClients(t, k)

	// The topics as created: three replicas, two in sync required.
	admin, err := sarama.NewClusterAdmin(k.Addrs(), kafkautil.NewConfig("test-admin"))
	require.NoError(t, err)
	defer admin.Close()
	for _, topic := range []string{"prompts", "wakes", "session-events"} {
		metas, err := admin.DescribeTopics([]string{topic})
		require.NoError(t, err)
		for _, p := range metas[0].Partitions {
			require.Len(t, p.Replicas, 3, "%s/%d replicas", topic, p.ID)
		}
		res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"min.insync.replicas"}}}, sarama.DescribeConfigsOptions{})
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.Equal(t, sarama.ErrNoError, res[0].ErrorCode, res[0].ErrorMsg)
		entries := res[0].Configs
		require.Len(t, entries, 1)
		require.Equal(t, "2", entries[0].Value, "%s min.insync.replicas", topic)
	}

	load := startLoad(t, b.producer, "s-bf", 12, 100*time.Millisecond)
	load.waitSent(t, 30, 2*time.Minute)
	require.Eventually(t, func() bool { return len(b.admissionsSince(t, nil, time.Time{})) >= 20 },
		2*time.Minute, 50*time.Millisecond, "admissions before the faults")

	// Fault 1: SIGKILL the leader of partitions in use; the group's
	// coordinator is chosen (a fresh topic has a leader on every node, so
	// it leads some), so that the consumer loses its group as well as
	// leaders.
	victim, err := k.Coordinator(b.group)
	require.NoError(t, err)
	var touched []int32
	for p := range int32(testPartitions) {
		if l, err := k.Leader("prompts", p); err == nil && l == victim {
			touched = append(touched, p)
		}
	}
	require.NotEmpty(t, touched, "node %d leads prompts partitions", victim)
	killedAt := time.Now()
	k.KillNode(victim)
	t.Logf("fault 1: SIGKILL of node %d, leader of prompts partitions %v", victim, touched)
	// Admission resumes on the touched partitions, from prompts sent after
	// the kill.
	require.Eventually(t, func() bool { return len(b.admissionsSince(t, touched, killedAt)) >= 5 },
		3*time.Minute, 50*time.Millisecond, "admission on partitions %v after the kill", touched)
	load.waitSent(t, 30, 2*time.Minute)
	restartAt := time.Now()
	require.NoError(t, k.RestartNode(victim))
	t.Logf("fault 1: node %d back after %s (restart took %s)", victim, time.Since(killedAt).Round(time.Millisecond), time.Since(restartAt).Round(time.Millisecond))
	load.waitSent(t, 30, 2*time.Minute)
	fault1End := time.Now()

	// Fault 2: the coordinator stopped past the session timeout.
	coord, err := k.Coordinator(b.group)
	require.NoError(t, err)
	var paused, others []int32
	for p := range int32(testPartitions) {
		if l, err := k.Leader("prompts", p); err == nil && l == coord {
			paused = append(paused, p)
		} else {
			others = append(others, p)
		}
	}
	pausedAt := time.Now()
	require.NoError(t, k.PauseNode(coord))
	t.Cleanup(func() { _ = k.ResumeNode(coord) })
	t.Logf("fault 2: SIGSTOP of node %d, the group coordinator, leader of prompts partitions %v", coord, paused)
	// The fault's length, not a synchronisation: the node stays stopped
	// past the consumer's session timeout (10s) and the brokers' (9s).
	hold := time.NewTimer(20 * time.Second)
	<-hold.C
	require.NoError(t, k.ResumeNode(coord))
	resumedAt := time.Now()
	t.Logf("fault 2: SIGCONT of node %d after %s", coord, resumedAt.Sub(pausedAt).Round(time.Millisecond))
	require.Eventually(t, func() bool { return len(b.admissionsSince(t, nil, resumedAt)) >= 10 },
		3*time.Minute, 50*time.Millisecond, "admission after the coordinator came back")
	load.waitSent(t, 30, 2*time.Minute)
	load.halt()
	all, sendErrs := load.snapshot()

	completed, reconciled := b.requireSingleWriter(t, r, all)
	end := time.Now()
	require.Eventually(t, func() bool { return ready.notReadyNow() == false }, time.Minute, 100*time.Millisecond, "ready at the end")

	adm := b.admissionsSince(t, touched, killedAt.Add(-time.Second))
	admAll := b.admissionsSince(t, nil, pausedAt.Add(-time.Second))
	admPaused := b.admissionsSince(t, paused, pausedAt.Add(-time.Second))
	admOthers := b.admissionsSince(t, others, pausedAt.Add(-time.Second))
	evs := r.arrivals()
	down1, dur1 := ready.notReadyWithin(killedAt, fault1End)
	down2, dur2 := ready.notReadyWithin(pausedAt, end)
	t.Logf("%d prompts acknowledged (%d sends retried), %d completed, %d reconciled as outcome unknown", len(all), sendErrs, completed, reconciled)
	t.Logf("STALL fault 1 (SIGKILL leader node %d of %v): admission on those partitions resumed %s after the kill, longest gap %s; first session event %s after, longest event gap %s; not ready: %v (%s)",
		victim, touched, firstAfter(adm, killedAt).Round(time.Millisecond), longestGap(adm, killedAt, fault1End).Round(time.Millisecond),
		firstAfter(evs, killedAt).Round(time.Millisecond), longestGap(evs, killedAt, fault1End).Round(time.Millisecond), down1, dur1.Round(time.Millisecond))
	t.Logf("STALL fault 2 (SIGSTOP coordinator node %d for %s): longest admission gap %s on its partitions %v, %s on the others %v, %s on all (first after SIGCONT %s); longest event gap %s; not ready: %v (%s)",
		coord, resumedAt.Sub(pausedAt).Round(time.Millisecond),
		longestGap(admPaused, pausedAt, end).Round(time.Millisecond), paused, longestGap(admOthers, pausedAt, end).Round(time.Millisecond), others,
		longestGap(admAll, pausedAt, end).Round(time.Millisecond),
		firstAfter(admAll, resumedAt).Round(time.Millisecond), longestGap(evs, pausedAt, end).Round(time.Millisecond), down2, dur2.Round(time.Millisecond))
	t.Logf("readiness:\n%s", ready)
	require.True(t, down1, "/readyz and promptline_ready show the outage of fault 1 (the group's coordinator killed)")
	// A stopped node leaves the consumer's requests unanswered: not ready
	// from 5s on, until the cluster fences it and the consumer cuts it off
	// (kafkautil.BrokerWatch; it said ready throughout before).
	require.True(t, down2, "/readyz and promptline_ready show the outage of fault 2 (the group's coordinator stopped)")
}

// TestApacheStoppedLeaderFailsOver stops (SIGSTOP, not SIGKILL) a node of
// a three-node cluster that leads prompts partitions in use, while prompts
// are produced and turns run. A stopped node keeps its TCP connections
// open: a request already sent to it gets no answer and no error. Once the
// controller has fenced the node (broker.session.timeout.ms, 9s) and moved
// its leaderships, admission on the partitions it led, wakes and session
// events must resume within a bound well below the clients' read timeout
// of the group (65s), and /readyz must have shown the outage; then SIGCONT.
// The promises hold over every acknowledged prompt.
func TestApacheStoppedLeaderFailsOver(t *testing.T) {
	b, k := apacheSetup(t, 3)
	flags := []string{"--replication-factor", "3", "--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s"}
	c := b.start(t, "consumer", "", flags...)
	metricsAddr, _ := c.waitLog(t, "consumer running", 3*time.Minute)["metrics_addr"].(string)
	require.NotEmpty(t, metricsAddr)
	ready := sampleReady(t, metricsAddr)
	r := b.connectClients(t, k)

	load := startLoad(t, b.producer, "s-sl", 12, 100*time.Millisecond)
	load.waitSent(t, 30, 2*time.Minute)
	require.Eventually(t, func() bool { return len(b.admissionsSince(t, nil, time.Time{})) >= 20 },
		2*time.Minute, 50*time.Millisecond, "admissions before the fault")

	// The victim leads prompts partitions in use; a node that is not the
	// group's coordinator if there is one (TestApacheBrokerFailure stops
	// the coordinator), so that what stalls is the leaders' traffic.
	coord, err := k.Coordinator(b.group)
	require.NoError(t, err)
	leads := map[int][]int32{}
	for p := range int32(testPartitions) {
		l, err := k.Leader("prompts", p)
		require.NoError(t, err)
		leads[l] = append(leads[l], p)
	}
	victim := coord
	for n, ps := range leads {
		if n != coord && len(ps) > 0 {
			victim = n
			break
		}
	}
	touched := leads[victim]
	require.NotEmpty(t, touched, "node %d leads prompts partitions", victim)

	pausedAt := time.Now()
	require.NoError(t, k.PauseNode(victim))
	t.Cleanup(func() { _ = k.ResumeNode(victim) })
	t.Logf("SIGSTOP of node %d (coordinator %d), leader of prompts partitions %v", victim, coord, touched)

	// What Kafka gives: the controller moves the leaderships once the node
	// missed its session (broker.session.timeout.ms).
	require.Eventually(t, func() bool {
		for _, p := range touched {
			if l, err := k.Leader("prompts", p); err != nil || l == victim {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "leadership of %v moved off the stopped node", touched)
	movedAt := time.Now()
	t.Logf("leadership of %v moved %s after the SIGSTOP", touched, movedAt.Sub(pausedAt).Round(time.Millisecond))

	// The bound: well below the group client's 65s read timeout.
	const bound = 25 * time.Second
	require.Eventually(t, func() bool { return len(b.admissionsSince(t, touched, movedAt)) >= 5 },
		bound, 50*time.Millisecond, "admission on %v resumed within %s of the failover", touched, bound)
	require.Eventually(t, func() bool {
		return len(r.arrivals()) > 0 && r.arrivals()[len(r.arrivals())-1].After(movedAt) && len(b.admissionsSince(t, nil, movedAt)) >= 10
	},
		bound, 50*time.Millisecond, "session events published within %s of the failover", bound)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND created_at < $1`, movedAt) == 0
	}, bound, 100*time.Millisecond, "outbox rows (wakes, events) written before the failover published within %s", bound)
	resumeAdmission := time.Now()
	notReady, notReadyFor := ready.notReadyWithin(pausedAt, resumeAdmission)

	require.NoError(t, k.ResumeNode(victim))
	resumedAt := time.Now()
	load.waitSent(t, 30, 2*time.Minute)
	load.halt()
	all, sendErrs := load.snapshot()
	completed, reconciled := b.requireSingleWriter(t, r, all)
	end := time.Now()
	require.Eventually(t, func() bool { return !ready.notReadyNow() }, time.Minute, 100*time.Millisecond, "ready at the end")

	adm := b.admissionsSince(t, touched, pausedAt.Add(-time.Second))
	evs := r.arrivals()
	t.Logf("%d prompts acknowledged (%d sends retried), %d completed, %d reconciled as outcome unknown", len(all), sendErrs, completed, reconciled)
	t.Logf("STALL SIGSTOP of leader node %d of %v for %s: leadership moved after %s; admission on those partitions resumed %s after the SIGSTOP, longest gap %s; longest event gap %s; not ready: %v (%s)",
		victim, touched, resumedAt.Sub(pausedAt).Round(time.Millisecond), movedAt.Sub(pausedAt).Round(time.Millisecond),
		firstAfter(adm, movedAt).Round(time.Millisecond)+movedAt.Sub(pausedAt).Round(time.Millisecond), longestGap(adm, pausedAt, end).Round(time.Millisecond),
		longestGap(evs, pausedAt, end).Round(time.Millisecond), notReady, notReadyFor.Round(time.Millisecond))
	t.Logf("readiness:\n%s", ready)
	require.True(t, notReady, "/readyz and promptline_ready showed the outage of the stopped leader")
}
