package pipeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// resetSession is the part of a consumer-group session that Setup uses:
// its claims, its context, and the offsets it was told to reset to.
type resetSession struct {
	sarama.ConsumerGroupSession // nil: any other method panics
	ctx                         context.Context
	claims                      map[string][]int32

	mu     sync.Mutex
	resets map[string]map[int32]int64
}

func (s *resetSession) Claims() map[string][]int32 { return s.claims }
func (s *resetSession) GenerationID() int32        { return 1 }
func (s *resetSession) Context() context.Context   { return s.ctx }
func (s *resetSession) ResetOffset(topic string, partition int32, offset int64, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resets[topic] == nil {
		s.resets[topic] = map[int32]int64{}
	}
	s.resets[topic][partition] = offset
}

// A topic whose ID changes between two assignments was deleted and created
// again: its claimed partitions are reset to their oldest offset, and only
// its; a lookup that fails changes nothing and leaves the old ID on
// record; a change during an assignment ends it.
func TestSetupResetsATopicCreatedAgain(t *testing.T) {
	t.Parallel()
	idA, idB := sarama.Uuid{1}, sarama.Uuid{2}
	var mu sync.Mutex
	ids := map[string]sarama.Uuid{"prompts": idA, "wakes": {9}, "permission-replies": {8}}
	var idsErr, oldestErr error
	c := NewConsumer(nil, nil, nil, &ConsumerConfig{
		TopicCheckInterval: 10 * time.Millisecond,
		TopicIDsFunc: func(topics []string) (map[string]sarama.Uuid, error) {
			mu.Lock()
			defer mu.Unlock()
			if idsErr != nil {
				return nil, idsErr
			}
			out := map[string]sarama.Uuid{}
			for _, t := range topics {
				if id, ok := ids[t]; ok {
					out[t] = id
				}
			}
			return out, nil
		},
		OldestOffsetFunc: func(topic string, partition int32) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			return 100 + int64(partition), oldestErr
		},
	})
	set := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
	}
	// setup runs one assignment's Setup and returns its session, ended
	// with the test.
	setup := func() (*resetSession, error) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s := &resetSession{ctx: ctx, resets: map[string]map[int32]int64{},
			claims: map[string][]int32{"prompts": {0, 2}, "wakes": {0, 2}, "permission-replies": {1}}}
		err := c.Setup(s)
		return s, err
	}

	s, err := setup()
	require.NoError(t, err)
	require.Empty(t, s.resets, "the first assignment has nothing to compare with")
	s, err = setup()
	require.NoError(t, err)
	require.Empty(t, s.resets, "the same IDs")

	set(func() { ids["prompts"], idsErr = idB, errors.New("metadata refused") })
	s, err = setup()
	require.NoError(t, err, "an ID lookup that fails does not fail the assignment")
	require.Empty(t, s.resets)

	set(func() { idsErr, oldestErr = nil, errors.New("no leader") })
	_, err = setup()
	require.ErrorContains(t, err, "topic prompts was created again", "the reset is tried again at the next join")

	set(func() { oldestErr = nil })
	s, err = setup()
	require.NoError(t, err)
	require.Equal(t, map[string]map[int32]int64{"prompts": {0: 100, 2: 102}}, s.resets, "prompts read again from its oldest offsets")
	s, err = setup()
	require.NoError(t, err)
	require.Empty(t, s.resets, "reset once: the new ID is on record")

	// During an assignment.
	select {
	case <-c.recreatedChan():
		t.Fatal("the assignment ended with no topic created again")
	case <-time.After(50 * time.Millisecond): // five checks
	}
	set(func() { ids["permission-replies"] = sarama.Uuid{7} })
	select {
	case <-c.recreatedChan():
	case <-time.After(10 * time.Second):
		t.Fatal("a topic created again during the assignment did not end it")
	}
	s, err = setup()
	require.NoError(t, err)
	require.Equal(t, map[string]map[int32]int64{"permission-replies": {1: 101}}, s.resets)
}

// A lookup of the topic IDs that gets no answer (a stopped broker that is
// not cut off yet holds a request for the client's read timeout) does not
// hold the assignment's start: Setup gives it up after topicLookupTimeout.
func TestSetupDoesNotWaitForASilentBroker(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	c := NewConsumer(nil, nil, nil, &ConsumerConfig{
		TopicCheckInterval: time.Hour,
		TopicIDsFunc: func([]string) (map[string]sarama.Uuid, error) {
			<-release
			return nil, errors.New("released")
		},
		OldestOffsetFunc: func(string, int32) (int64, error) { return 0, nil },
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &resetSession{ctx: ctx, resets: map[string]map[int32]int64{}, claims: map[string][]int32{"prompts": {0}}}
	start := time.Now()
	require.NoError(t, c.Setup(s))
	require.Less(t, time.Since(start), topicLookupTimeout+time.Second)
	require.Empty(t, s.resets)
}

// Two topics created again, and the oldest offset of the second one read
// fails (a new topic's leader not elected yet): the Setup fails, and the
// next one resets both. Its session ended with the Setup, so the reset of
// the first one may never have been committed: had its new ID been
// recorded all the same, the next Setup would take the topic as seen and
// read it from the offsets committed in the old numbering.
func TestSetupRecordsNoIDOfAFailedReset(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	ids := map[string]sarama.Uuid{"prompts": {1}, "wakes": {2}, "permission-replies": {3}}
	calls, failCall := 0, 0
	c := NewConsumer(nil, nil, nil, &ConsumerConfig{
		TopicCheckInterval: time.Hour,
		TopicIDsFunc: func(topics []string) (map[string]sarama.Uuid, error) {
			mu.Lock()
			defer mu.Unlock()
			out := map[string]sarama.Uuid{}
			for _, t := range topics {
				out[t] = ids[t]
			}
			return out, nil
		},
		OldestOffsetFunc: func(topic string, partition int32) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls == failCall {
				return 0, errors.New("no leader")
			}
			return 100 + int64(partition), nil
		},
	})
	setup := func() (*resetSession, error) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s := &resetSession{ctx: ctx, resets: map[string]map[int32]int64{},
			claims: map[string][]int32{"prompts": {0, 2}, "wakes": {0, 2}}}
		return s, c.Setup(s)
	}
	_, err := setup()
	require.NoError(t, err)

	// Whichever topic is reset first (two partitions, two reads), the
	// other's first read fails.
	mu.Lock()
	ids["prompts"], ids["wakes"], failCall = sarama.Uuid{11}, sarama.Uuid{12}, 3
	mu.Unlock()
	_, err = setup()
	require.ErrorContains(t, err, "was created again")

	s, err := setup()
	require.NoError(t, err)
	require.Equal(t, map[string]map[int32]int64{"prompts": {0: 100, 2: 102}, "wakes": {0: 100, 2: 102}}, s.resets,
		"both topics read again from their oldest offsets")
}

// A Setup whose lookup of the IDs fails (a broker slow to answer) leaves
// them to the watcher: it takes the IDs it first reads as the ones the
// positions refer to, so a topic created again later in the same
// assignment still ends it, and the next Setup resets that topic. Before,
// the watcher compared only with the IDs Setup had read, none, and a
// consumer whose first lookup failed never noticed a topic created again.
func TestWatcherLearnsTheIDsSetupCouldNotRead(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	ids := map[string]sarama.Uuid{"prompts": {1}, "wakes": {2}, "permission-replies": {3}}
	idsErr := errors.New("metadata refused")
	lookups := 0
	c := NewConsumer(nil, nil, nil, &ConsumerConfig{
		TopicCheckInterval: 10 * time.Millisecond,
		TopicIDsFunc: func(topics []string) (map[string]sarama.Uuid, error) {
			mu.Lock()
			defer mu.Unlock()
			lookups++
			if idsErr != nil {
				return nil, idsErr
			}
			out := map[string]sarama.Uuid{}
			for _, t := range topics {
				out[t] = ids[t]
			}
			return out, nil
		},
		OldestOffsetFunc: func(topic string, partition int32) (int64, error) { return 100 + int64(partition), nil },
	})
	setup := func() (*resetSession, error) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s := &resetSession{ctx: ctx, resets: map[string]map[int32]int64{},
			claims: map[string][]int32{"prompts": {0, 2}}}
		return s, c.Setup(s)
	}
	first, err := setup()
	require.NoError(t, err)
	require.Empty(t, first.resets)
	mu.Lock()
	idsErr = nil
	seen := lookups
	mu.Unlock()
	// The watcher reads the IDs (twice: the one after the first read
	// compares with it).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lookups >= seen+2
	}, 10*time.Second, time.Millisecond)
	mu.Lock()
	ids["prompts"] = sarama.Uuid{11}
	mu.Unlock()
	select {
	case <-c.recreatedChan():
	case <-time.After(10 * time.Second):
		t.Fatal("a topic created again during the assignment did not end it")
	}
	s, err := setup()
	require.NoError(t, err)
	require.Equal(t, map[string]map[int32]int64{"prompts": {0: 100, 2: 102}}, s.resets)
}

// A consumer that never saw a topic's old ID (started, or joined the
// group, after the topic was created again) still resets a partition
// whose committed offset was marked under another ID: a member still at
// the old topic's positions committed them onto the new one. The marks
// carry the ID they were made under; a commit with no ID (an older
// member's) is taken as it is.
func TestSetupResetsOffsetsCommittedUnderAnotherID(t *testing.T) {
	t.Parallel()
	oldID, newID := sarama.Uuid{1}, sarama.Uuid{11}
	committed := map[string]map[int32]string{
		"prompts": {0: oldID.String(), 1: newID.String(), 2: ""},
	}
	c := NewConsumer(nil, nil, nil, &ConsumerConfig{
		TopicCheckInterval: time.Hour,
		TopicIDsFunc: func(topics []string) (map[string]sarama.Uuid, error) {
			return map[string]sarama.Uuid{"prompts": newID, "wakes": {2}, "permission-replies": {3}}, nil
		},
		OldestOffsetFunc: func(topic string, partition int32) (int64, error) { return 100 + int64(partition), nil },
		CommittedMetadataFunc: func(topic string, partitions []int32) (map[int32]string, error) {
			out := map[int32]string{}
			for _, p := range partitions {
				out[p] = committed[topic][p]
			}
			return out, nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &resetSession{ctx: ctx, resets: map[string]map[int32]int64{},
		claims: map[string][]int32{"prompts": {0, 1, 2}, "wakes": {0}}}
	require.NoError(t, c.Setup(s))
	require.Equal(t, map[string]map[int32]int64{"prompts": {0: 100}}, s.resets,
		"only the partition committed under the old ID is read again")
	require.Equal(t, newID.String(), c.markMetadata("prompts"), "marks carry the topic's ID")
}
