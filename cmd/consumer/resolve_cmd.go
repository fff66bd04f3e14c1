package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/user"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// newResolveCommand is `consumer session resolve`: an operator's finding
// on a tool call or provider attempt left unknown, audited like a
// quarantine release (docs/runbook.md, "A turn failed with outcome_unknown").
func newResolveCommand(o *options) *cobra.Command {
	var ran, didNotRun, asJSON bool
	var output, operator, note string
	var round int
	cmd := &cobra.Command{
		Use:   "resolve SESSION CALL_OR_ATTEMPT (--ran [--output JSON] | --did-not-run) [--round N]",
		Short: "Record what an operator found out about a tool call or provider attempt left unknown, and continue its turn when it can go on; audited",
		Long: `Record an operator's finding on a tool call or provider attempt whose outcome is unknown
(consumer session show lists them), and continue the turn when it can go on:

  --did-not-run  on a tool call: the continuation runs it, once; on a provider attempt:
                 the continuation sends its step again
  --ran          on a tool call: the model is handed --output as its result, nothing runs;
                 on a provider attempt: recorded only (its answer is lost; the turn ends failed)

The continuation input's ID is derived from the call or attempt and the round, so running the
command again with the same finding changes nothing. A call that the continuation of a
--did-not-run finding ran, and that is unknown again, is a new round: a finding about that run
must name it (--round 2, and so on; the refusal says which), so that a repeated command never
vouches for a run it was not about. It is refused while a claim holds the session, when a newer
turn superseded the call's turn, while a later step of the turn is unknown too, and when
another finding was recorded before.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ran == didNotRun {
				return errors.New("say what you found: exactly one of --ran and --did-not-run")
			}
			finding := recovery.FindingDidNotRun
			if ran {
				finding = recovery.FindingRan
			} else if cmd.Flags().Changed("output") {
				return errors.New("--output: goes only with --ran (the result the call returned)")
			}
			if output != "" && !json.Valid([]byte(output)) {
				return fmt.Errorf("--output: not valid JSON: %q", output)
			}
			if operator == "" {
				if u, err := user.Current(); err == nil {
					operator = u.Username
				}
			}
			if operator == "" {
				return errors.New("--operator: must name who found it out")
			}
			return withDB(cmd, o, func(db *pgdb.DB) error {
				res, err := recovery.Resolve(cmd.Context(), db.Pool, args[0], args[1], &recovery.ResolveOpts{
					Finding: finding, Output: output, Operator: operator, Note: note, Round: round, Topics: o.topics,
				})
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
				}
				r := res.Resolution
				out := cmd.OutOrStdout()
				if res.Already {
					fmt.Fprintf(out, "%s %s was resolved before (round %d, %s, by %s): nothing more done\n", r.TargetKind, r.TargetID, r.Round, r.Finding, r.ResolvedBy)
					return nil
				}
				fmt.Fprintf(out, "resolved %s %s (round %d): %s\n", r.TargetKind, r.TargetID, r.Round, r.Finding)
				if r.ContinuationID != "" {
					fmt.Fprintf(out, "admitted continuation %s; the session's consumer runs it\n", r.ContinuationID)
				} else {
					fmt.Fprintln(out, "no continuation: the attempt's answer is lost, so the turn does not go on; send the prompt again if it should")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&ran, "ran", false, "the call ran (or the provider acted on the attempt)")
	cmd.Flags().BoolVar(&didNotRun, "did-not-run", false, "the call did not run (or the provider did not act on the attempt): the continuation runs it")
	cmd.Flags().StringVar(&output, "output", "", "with --ran on a tool call: the result it returned, as JSON, handed to the model")
	cmd.Flags().StringVar(&operator, "operator", "", "who found it out (default: the OS user), recorded in the audit")
	cmd.Flags().StringVar(&note, "note", "", "how it was found out, recorded in the audit")
	cmd.Flags().IntVar(&round, "round", 0, "the resolution round the finding is about, once a call is unknown again after an earlier round's continuation ran it (default: the round it is in)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the resolution as JSON")
	outboxTopicFlags(cmd.Flags(), &o.topics)
	return cmd
}
