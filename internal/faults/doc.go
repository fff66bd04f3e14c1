// Package faults holds crash points for the crash tests. Hit(name) kills the
// process with SIGKILL when the binary was built with the "faults" build tag
// and PROMPTLINE_FAULT names that point; in normal builds it compiles to
// nothing.
//
// Points: see the Point* constants.
package faults

// Crash points, in the order a prompt meets them.
const (
	// AdmissionAfterCommit: the admission transaction committed, the Kafka
	// offset not yet marked.
	AdmissionAfterCommit = "admission.after-commit"
	// RelayAfterPublish: outbox rows published, not yet marked.
	RelayAfterPublish = "relay.after-publish"
	// TurnAfterPromote: inputs promoted, provider not yet called.
	TurnAfterPromote = "turn.after-promote"
)
