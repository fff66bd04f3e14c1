package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/internal/cliconfig"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
)

const brokersDefault = "127.0.0.1:9092"

// kafkaOpts are the root's Kafka flags, shared by every command.
type kafkaOpts struct {
	brokers  string
	security kafkautil.Security
}

// config builds the client configuration of a command: the brokers, the
// security settings checked (so that a bad one is refused, naming its
// flag, before anything connects).
func (k *kafkaOpts) config(clientID string) (*client.Config, error) {
	brokers, err := parseBrokers(k.brokers)
	if err != nil {
		return nil, err
	}
	if err := k.security.Apply(sarama.NewConfig()); err != nil {
		return nil, err
	}
	return &client.Config{Brokers: brokers, ClientID: clientID, Security: k.security}, nil
}

// newRootCommand builds the producer command tree. Commands read and write
// only the given streams, so tests run them in-process.
func newRootCommand(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	return newRootCommandEnv(stdin, stdout, stderr, os.Environ)
}

// newRootCommandEnv is newRootCommand with its environment settings read
// from environ (tests pass their own and run in parallel).
func newRootCommandEnv(stdin io.Reader, stdout, stderr io.Writer, environ func() []string) *cobra.Command {
	k := &kafkaOpts{}
	var configFile string
	root := &cobra.Command{
		Use:   "producer",
		Short: "Publish prompts to promptline, answer its permission requests and watch its session events",
		Long: `producer publishes prompt envelopes to promptline's prompts topic (Kafka key =
session ID, murmur2 partitioner as in the Java client), replies to permission
requests, and prints the session events promptline publishes back. It is built
on the Go package github.com/promptline/promptline/client. See
docs/producers.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	pf := root.PersistentFlags()
	pf.StringVar(&configFile, "config", "", "YAML file of settings, keys = flag names; precedence: flag > env PROMPTLINE_<FLAG> > file > default")
	pf.StringVar(&k.brokers, "brokers", brokersDefault, "Kafka bootstrap brokers, comma-separated host:port")
	pf.BoolVar(&k.security.TLS, "tls", false, "connect with TLS (certificates are always verified)")
	pf.StringVar(&k.security.CAFile, "tls-ca-file", "", "PEM file of CA certificates trusted for the brokers, added to the system's")
	pf.StringVar(&k.security.CertFile, "tls-cert-file", "", "PEM client certificate (mutual TLS), with --tls-key-file")
	pf.StringVar(&k.security.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	pf.StringVar(&k.security.ServerName, "tls-server-name", "", "name verified in the brokers' certificates (default: the host of each broker address)")
	pf.StringVar(&k.security.SASLMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (empty: no SASL)")
	pf.StringVar(&k.security.SASLUser, "sasl-user", "", "SASL user (PLAIN, SCRAM)")
	pf.StringVar(&k.security.SASLPasswordFile, "sasl-password-file", "", "file holding the SASL password (PLAIN, SCRAM)")
	pf.StringVar(&k.security.SASLTokenFile, "sasl-token-file", "", "file holding the OAUTHBEARER token, read again at each connection")
	root.AddCommand(newSendCommand(k), newWatchCommand(k), newReplyCommand(k))
	cliconfig.New(&cliconfig.Config{EnvironFunc: environ, IgnoreEnv: slices.Concat(faults.EnvVars, kafkautil.TestEnvVars), Program: "producer"}).Install(root)
	return root
}

// parseBrokers splits the --brokers value.
func parseBrokers(s string) ([]string, error) {
	var out []string
	for b := range strings.SplitSeq(s, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
		if err := kafkautil.CheckBrokerAddr(b); err != nil {
			return nil, err
		}
		out = append(out, b)
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
