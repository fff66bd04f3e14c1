package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal cancels ctx and lets commands finish what is in
	// flight; restoring the default handling then makes a second one kill.
	context.AfterFunc(ctx, stop)
	return newRootCommand(os.Stdin, os.Stdout, os.Stderr).ExecuteContext(ctx)
}
