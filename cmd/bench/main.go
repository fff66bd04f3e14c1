// Command bench prints promptline's performance figures from one run: the
// raw Postgres ceiling for admission's rows, admission throughput through
// the real consumer path, and end-to-end latency through the full pipeline,
// against the local Postgres and the embedded broker over TCP; and the
// figures the performance goals are set in: a consumer process's
// burn-down, the turn ceiling, River's burn-down as a peer, the cost per
// turn and the latency at half of the burn-down's rate. See
// docs/benchmarks.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal cancels ctx: measurements stop and the scratch
	// databases are dropped (bounded by timeouts). Restoring the default
	// handling then makes a second signal kill at once.
	context.AfterFunc(ctx, stop)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
