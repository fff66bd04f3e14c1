//go:build apachekafka

package main

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// TestApacheBrokerOutageLongerThanTimeouts: the only node is out for 80s,
// longer than every timeout of the consumer's clients (session 10s,
// requests 15s, the group's 65s): SIGKILLed, then started again on its
// data (Killed); or SIGSTOPped, its connections open and silent, then
// SIGCONTed (Paused: with one node no cluster fences it, so the consumer
// never cuts it off). The consumer, never restarted, admits and answers
// prompts sent after the outage and its relay publishes every outbox row:
// the group, every partition and the relay resume by themselves.
func TestApacheBrokerOutageLongerThanTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		down, back func(k *testkit.ApacheKafka) error
	}{
		{"Killed", func(k *testkit.ApacheKafka) error { k.KillNode(1); return nil }, func(k *testkit.ApacheKafka) error { return k.RestartNode(1) }},
		{"Paused", func(k *testkit.ApacheKafka) error { return k.PauseNode(1) }, func(k *testkit.ApacheKafka) error { return k.ResumeNode(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, k := apacheSetup(t, 1)
			c := b.start(t, "consumer", "", "--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s")
			c.waitLog(t, "consumer running", 3*time.Minute)
			p := apacheProducer(t, k.Addrs())
			before := sendPrompts(t, p, "s-out-before", 4)
			for _, m := range before {
				b.answered(t, m.MessageID, 2*time.Minute)
			}

			require.NoError(t, tc.down(k))
			t.Cleanup(func() { _ = k.ResumeNode(1) })
			downAt := time.Now()
			<-time.After(80 * time.Second) // the outage's length, not a synchronisation
			require.NoError(t, tc.back(k))
			upAt := time.Now()
			t.Logf("broker out for %s", upAt.Sub(downAt).Round(time.Millisecond))
			after := sendPrompts(t, p, "s-out-after", 4)
			for _, m := range after {
				b.answered(t, m.MessageID, 3*time.Minute)
			}
			t.Logf("OUTAGE %s: prompts sent after it answered %s after its end", tc.name, time.Since(upAt).Round(time.Millisecond))
			require.Eventually(t, func() bool {
				return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
			}, 2*time.Minute, 100*time.Millisecond, "every outbox row published")
			require.True(t, c.running(), "the consumer outlived the outage")
			b.requireOnce(t, append(before, after...))
		})
	}
}

// groupOffsets returns the group's committed offsets of topic, by
// partition (-1: none).
func groupOffsets(t *testing.T, admin sarama.ClusterAdmin, group, topic string) map[int32]int64 {
	t.Helper()
	res, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0, 1, 2, 3}})
	require.NoError(t, err)
	out := map[int32]int64{}
	for p, b := range res.Blocks[topic] {
		out[p] = b.Offset
	}
	return out
}

// commitGroupOffsets commits offsets of topic for the group, which has no
// member (an operator's kafka-consumer-groups.sh --reset-offsets).
func commitGroupOffsets(t *testing.T, addrs []string, group, topic string, offsets func(p int32) int64) {
	t.Helper()
	client, err := sarama.NewClient(addrs, kafkautil.NewConfig("test-offsets"))
	require.NoError(t, err)
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	require.NoError(t, err)
	for p := range int32(testPartitions) {
		pom, err := om.ManagePartition(topic, p)
		require.NoError(t, err)
		o := offsets(p)
		pom.ResetOffset(o, "")
		pom.MarkOffset(o, "")
		require.NoError(t, pom.Close())
	}
	om.Commit()
	require.NoError(t, om.Close())
	admin := apacheAdmin(t, addrs)
	require.Eventually(t, func() bool {
		for p, o := range groupOffsets(t, admin, group, topic) {
			if o != offsets(p) {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "%s offsets committed", topic)
}

// TestApacheOffsetsReset: the group's committed offsets are moved by an
// operator while no consumer runs.
//
//  1. Reset to earliest on prompts, wakes and permission-replies: every
//     prompt is delivered again and is an exact retry (P2): no input, turn
//     or event more.
//  2. Out of range: prompts sent while the consumer is down are deleted
//     (DeleteRecords, as retention does) before it starts: its committed
//     offsets lie below the log start, it starts from the oldest offset
//     held and goes on; the deleted prompts are gone with the log, which
//     nothing can admit (docs/runbook.md).
func TestApacheOffsetsReset(t *testing.T) {
	b, k := apacheSetup(t, 1)
	flags := []string{"--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s"}
	c := b.start(t, "consumer-1", "", flags...)
	c.waitLog(t, "consumer running", 3*time.Minute)
	p := apacheProducer(t, k.Addrs())
	admin := apacheAdmin(t, k.Addrs())
	first := sendPrompts(t, p, "s-reset", 20)
	for _, m := range first {
		b.answered(t, m.MessageID, 2*time.Minute)
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, time.Minute, 100*time.Millisecond, "every outbox row published")
	st := c.stop(t)
	require.True(t, st.Success(), "%s", st)
	events := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'`)
	inputs := b.count(t, `SELECT count(*) FROM inputs`)

	// 1. Reset to earliest.
	for _, topic := range []string{"prompts", "wakes", "permission-replies"} {
		commitGroupOffsets(t, k.Addrs(), b.group, topic, func(int32) int64 { return 0 })
	}
	hwm := map[int32]int64{}
	client, err := sarama.NewClient(k.Addrs(), kafkautil.NewConfig("test-hwm"))
	require.NoError(t, err)
	defer client.Close()
	for part := range int32(testPartitions) {
		hwm[part], err = client.GetOffset("prompts", part, sarama.OffsetNewest)
		require.NoError(t, err)
	}
	c = b.start(t, "consumer-2", "", flags...)
	c.waitLog(t, "consumer running", 3*time.Minute)
	require.Eventually(t, func() bool {
		for part, o := range groupOffsets(t, admin, b.group, "prompts") {
			if o < hwm[part] {
				return false
			}
		}
		return true
	}, 2*time.Minute, 100*time.Millisecond, "every prompt delivered again and its offset committed")
	marker := sendPrompts(t, p, "s-reset-marker", 1) // after the replayed ones on its partition
	b.answered(t, marker[0].MessageID, 2*time.Minute)
	require.Equal(t, inputs+1, b.count(t, `SELECT count(*) FROM inputs`), "no input admitted twice")
	b.requireOnce(t, append(first, marker...))
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, time.Minute, 100*time.Millisecond, "every outbox row published")
	require.Equal(t, events, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events' AND key <> $1`, marker[0].SessionID),
		"no event but the marker's")
	st = c.stop(t)
	require.True(t, st.Success(), "%s", st)

	// 2. Out of range: what retention deleted is gone; the rest goes on.
	deleted := sendPrompts(t, p, "s-deleted", 8)
	upTo := map[int32]int64{}
	for part := range int32(testPartitions) {
		upTo[part], err = client.GetOffset("prompts", part, sarama.OffsetNewest)
		require.NoError(t, err)
	}
	require.NoError(t, admin.DeleteRecords("prompts", upTo))
	c = b.start(t, "consumer-3", "", flags...)
	c.waitLog(t, "consumer running", 3*time.Minute)
	later := sendPrompts(t, p, "s-later", 8)
	for _, m := range later {
		b.answered(t, m.MessageID, 2*time.Minute)
	}
	b.requireOnce(t, later)
	for _, m := range deleted {
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, m.MessageID), "deleted before it was read")
	}
}

// TestApachePartitionsAdded: two consumers share prompts and wakes (4
// partitions each) under a steady load when an operator raises both to 8.
// Sessions whose key now hashes to another partition move to its owner:
// their later prompts arrive on a partition another process may own while
// earlier ones may still be admitted or running elsewhere. Every
// acknowledged prompt is admitted once and answered by one turn (the
// claim's fencing token keeps one writer per session, whoever owns its
// partitions), the new partitions are consumed from their first record
// (Offsets.Initial is the oldest: a record written there before the group
// noticed them is not skipped), and no prompt waits for good.
func TestApachePartitionsAdded(t *testing.T) {
	b, k := apacheSetup(t, 1)
	flags := []string{"--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s"}
	members := []*proc{b.start(t, "consumer-1", "", flags...)}
	members[0].waitLog(t, "consumer running", 3*time.Minute)
	members = append(members, b.start(t, "consumer-2", "", flags...))
	members[1].waitLog(t, "consumer running", 3*time.Minute)
	r := b.connectClients(t, k)
	awaitShared(t, members)

	load := startLoad(t, b.producer, "s-pa", 12, 100*time.Millisecond)
	load.waitSent(t, 30, 2*time.Minute)
	admin := apacheAdmin(t, k.Addrs())
	for _, topic := range []string{"prompts", "wakes"} {
		require.NoError(t, admin.CreatePartitions(topic, 8, nil, false))
	}
	addedAt := time.Now()
	newParts := []int32{4, 5, 6, 7}
	var first time.Duration
	require.Eventually(t, func() bool {
		first = firstAfter(b.admissionsSince(t, newParts, addedAt), addedAt)
		return first >= 0
	}, 3*time.Minute, 100*time.Millisecond, "a prompt admitted from a new partition")
	load.waitSent(t, 60, 2*time.Minute)
	load.halt()
	all, sendErrs := load.snapshot()
	moved := b.count(t, `SELECT count(*) FROM (SELECT session_id FROM inputs WHERE session_id LIKE 's-pa-%'
		GROUP BY session_id HAVING count(DISTINCT source_partition) > 1) s`)
	require.Positive(t, moved, "some session's prompts came from two partitions")
	completed, reconciled := b.requireSingleWriter(t, r, all)
	t.Logf("PARTITIONS: first admission from a new partition %s after they were added; %d sessions moved; %d prompts acknowledged (%d sends retried), %d completed, %d reconciled",
		first.Round(time.Millisecond), moved, len(all), sendErrs, completed, reconciled)
}
