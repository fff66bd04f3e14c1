package executor

import "runtime"

// onOwnStack runs fn on a goroutine of its own and waits for it. It is for
// deep calls that neither wait nor block (encoding/json's reflection over
// a request or an event) made by an execution before it waits on its
// provider. A goroutine's stack grows to the deepest call it made and
// comes back down only when less than a quarter of it is in use at a
// collection; a parked execution uses some 5 KiB. The first step's
// encoding, on the execution's own goroutine, took every stack from 8 to
// 16 KiB for the whole of the provider's wait: 16.2 KiB of stack per
// execution, 158 MiB at ten thousand in flight, against 8.9 KiB once
// moved here (`bench inflight`, "stack per active execution";
// docs/benchmarks.md, "the RSS above explained"; guarded by
// TestParkedExecutionsKeepEightKiBStacks). The goroutine here ends
// at once, and its stack with it. A fn that waits (on the database, say)
// keeps a second stack per execution while it does: ten thousand claims
// waiting for the pool at once took the burst's stacks from 101 to 146
// MiB, measured and not kept for the claim. The transactions an
// execution writes itself (a failure, a deferral) run here all the same
// (execution.writeRetried), and so does a later step's intent (its read and its
// call, beginStepCall): pgx's path is deep, they come one execution at a
// time as answers arrive, not ten thousand at once, and run on the
// execution's goroutine they left 16 KiB for its next wait on the
// provider (TestParkedToolTurnsKeepEightKiBStacks). A turn's tool-call
// writes are calls sent through group commit, whose goroutines run pgx;
// only their retry after a lost commit runs a transaction on the
// execution's goroutine.
//
// A panic in fn ends the process as it would have on the caller's
// goroutine (its trace is fn's); a runtime.Goexit in fn ends the
// caller's goroutine too, as it would have.
func onOwnStack(fn func()) {
	returned := make(chan bool, 1)
	go func() {
		ok := false
		defer func() { returned <- ok }()
		fn()
		ok = true
	}()
	if !<-returned {
		runtime.Goexit()
	}
}
