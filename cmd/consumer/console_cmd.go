package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/console"
	"github.com/promptline/promptline/internal/pgdb"
)

// newConsoleCommand is `consumer console`: the operator console in the
// browser (docs/console.md).
func newConsoleCommand(o *options) *cobra.Command {
	var addr, tokenFile string
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator console (sessions, timelines, quarantine, recovery) in the browser",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token := ""
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("--console-token-file: %w", err)
				}
				token = strings.TrimSpace(string(b))
				if len(token) < 16 {
					return errors.New("--console-token-file: the token must be at least 16 characters")
				}
			}
			if err := console.CheckAddr(addr, token != ""); err != nil {
				return err
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				log, err := operatorLogger(cmd, o)
				if err != nil {
					return err
				}
				srv, err := console.New(db.Pool, &console.Config{Token: token, Logger: log, Topics: o.topics})
				if err != nil {
					return err
				}
				ln, err := net.Listen("tcp", addr)
				if err != nil {
					return err
				}
				hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
				done := make(chan error, 1)
				go func() { done <- hs.Serve(ln) }()
				url := "http://" + ln.Addr().String() + "/"
				fmt.Fprintf(cmd.OutOrStdout(), "console: %s\n", url)
				log.Info("console serving", slog.String("addr", ln.Addr().String()), slog.Bool("token", token != ""))
				select {
				case err := <-done:
					return err
				case <-cmd.Context().Done():
				}
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
				defer cancel()
				return hs.Shutdown(ctx)
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9470", "listen address of the console; other than loopback only with --console-token-file")
	cmd.Flags().StringVar(&tokenFile, "console-token-file", "", "file holding the console's token (at least 16 characters): every page then needs it, as Authorization: Bearer or through the login form")
	outboxTopicFlags(cmd.Flags(), &o.topics)
	return cmd
}
