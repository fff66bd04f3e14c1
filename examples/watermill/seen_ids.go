package eventsconsumer

import (
	"container/list"
	"sync"
)

// seenIDs is a bounded set of event IDs that forgets the least recently
// used one when full. Bounded because a long-running consumer sees
// unboundedly many events; least recently used because the relay
// republishes only what it had not marked published yet, so a repeat
// follows its original closely and old IDs are the safe ones to forget.
// Safe for concurrent use: partitions are handled concurrently.
type seenIDs struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used; values are IDs
	byID  map[string]*list.Element
}

func newSeenIDs(max int) *seenIDs {
	return &seenIDs{max: max, order: list.New(), byID: make(map[string]*list.Element, max)}
}

// contains reports whether id was added and not forgotten since, and
// counts as a use of it.
func (s *seenIDs) contains(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byID[id]
	if ok {
		s.order.MoveToFront(el)
	}
	return ok
}

// add remembers id, forgetting the least recently used ID when full.
func (s *seenIDs) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.byID[id]; ok {
		s.order.MoveToFront(el)
		return
	}
	s.byID[id] = s.order.PushFront(id)
	if s.order.Len() > s.max {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.byID, oldest.Value.(string))
	}
}
