// Command consumer runs promptline: admission, the outbox relay and the
// session executor, against Kafka and Postgres (embedded defaults when none
// are given). See the README for flags and subcommands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	// First signal: graceful stop (bounded by --shutdown-grace); second:
	// exit at once.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		cancel()
		<-sig
		fmt.Fprintln(os.Stderr, "consumer: second signal, exiting at once")
		os.Exit(130)
	}()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}
