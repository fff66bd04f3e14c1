package main

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/internal/pgdb"
)

func newSessionCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Inspect sessions; resolve what a turn left unknown"}
	var asJSON bool
	show := &cobra.Command{
		Use:   "show SESSION",
		Short: "Print what Postgres holds about a session: inputs, transcript (prompt texts included, bounded), claim, ledger, recoveries, resolutions, permissions",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDB(cmd, o, func(db *pgdb.DB) error {
				r, err := inspect.Session(cmd.Context(), db.Pool, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(r)
				}
				return inspect.Render(cmd.OutOrStdout(), r)
			})
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON (stable snake_case keys)")
	cmd.AddCommand(show, newResolveCommand(o))
	return cmd
}
