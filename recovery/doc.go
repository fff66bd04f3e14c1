// Package recovery will take over expired claims and re-emit only the
// continuation wakes that are provably safe (DESIGN.md P5, issue "Recovery").
// Nothing here yet: until it lands, an execution that crashes mid-turn
// leaves its session for an operator (see the crash tests in cmd/consumer).
package recovery
