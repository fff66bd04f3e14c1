package testkit

import "sync"

// Counts counts what a callback reports (an OnXFunc of a config), by
// label; safe for concurrent use, as callbacks run on the goroutines of
// the code under test. The zero value is ready to use.
type Counts struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one of label.
func (c *Counts) Add(label string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[label]++
}

// Get returns how many of label were counted.
func (c *Counts) Get(label string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[label]
}
