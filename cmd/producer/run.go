package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

const brokersDefault = "127.0.0.1:9092"

// newRootCommand builds the producer command tree. Commands read and write
// only the given streams, so tests run them in-process.
func newRootCommand(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	var brokers string
	root := &cobra.Command{
		Use:   "producer",
		Short: "Publish prompts to promptline and watch its session events",
		Long: `producer publishes prompt envelopes to promptline's prompts topic (Kafka key =
session ID, murmur2 partitioner as in the Java client) and prints the session
events promptline publishes back. See docs/producers.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	root.PersistentFlags().StringVar(&brokers, "brokers", brokersDefault, "Kafka bootstrap brokers, comma-separated host:port")
	root.AddCommand(newSendCommand(&brokers), newWatchCommand(&brokers))
	return root
}

// parseBrokers splits the --brokers value.
func parseBrokers(s string) ([]string, error) {
	var out []string
	for b := range strings.SplitSeq(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--brokers: want host:port[,host:port...], got %q", s)
	}
	return out, nil
}

// isTerminal reports whether w is a character device (a terminal), where a
// redrawn progress bar makes sense.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
