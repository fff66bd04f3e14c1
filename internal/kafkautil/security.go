package kafkautil

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// SASL mechanisms accepted by Security.SASLMechanism (the --sasl-mechanism flag).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
	SASLOAuthBearer = "OAUTHBEARER"
)

// Security is how a client authenticates to Kafka and protects the
// connection. The zero value is plaintext without authentication (the
// embedded broker). Certificate verification is always on: there is no
// option to skip it.
type Security struct {
	// TLS turns TLS on. CAFile (PEM) adds trusted roots to the system's;
	// CertFile and KeyFile present a client certificate; ServerName
	// overrides the name verified in the broker's certificate.
	TLS        bool
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string

	// SASLMechanism is one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
	// OAUTHBEARER; empty means no SASL.
	SASLMechanism string
	SASLUser      string
	// SASLPasswordFile holds the password (PLAIN, SCRAM); a file, so that
	// the secret stays out of flags, environment dumps and logs.
	SASLPasswordFile string
	// SASLTokenFile holds the OAUTHBEARER token; it is read again for each
	// new connection, so a rotated token is picked up.
	SASLTokenFile string
}

// Apply configures c. Errors name the setting at fault.
func (s Security) Apply(c *sarama.Config) error {
	if s.TLS {
		tc, err := s.tlsConfig()
		if err != nil {
			return err
		}
		c.Net.TLS.Enable, c.Net.TLS.Config = true, tc
	} else if s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.ServerName != "" {
		return errors.New("--tls: the TLS settings need --tls")
	}
	if s.SASLMechanism == "" {
		// As with TLS: a setting that would be ignored stops the program,
		// or a client meant to authenticate would connect without.
		if s.SASLUser != "" || s.SASLPasswordFile != "" || s.SASLTokenFile != "" {
			return errors.New("--sasl-mechanism: the SASL settings need --sasl-mechanism")
		}
		return nil
	}
	c.Net.SASL.Enable = true
	c.Net.SASL.Handshake = true
	mech := strings.ToUpper(s.SASLMechanism)
	switch mech {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.SASLTokenFile != "" {
			return fmt.Errorf("--sasl-token-file: used with OAUTHBEARER only, not with --sasl-mechanism %s", mech)
		}
		if s.SASLUser == "" {
			return fmt.Errorf("--sasl-user: required with --sasl-mechanism %s", mech)
		}
		pass, err := readSecret(s.SASLPasswordFile, "--sasl-password-file")
		if err != nil {
			return err
		}
		c.Net.SASL.User, c.Net.SASL.Password = s.SASLUser, pass
		c.Net.SASL.Mechanism = sarama.SASLMechanism(mech)
		switch mech {
		case SASLScramSHA256:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
		case SASLScramSHA512:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
		}
	case SASLOAuthBearer:
		if s.SASLUser != "" || s.SASLPasswordFile != "" {
			return errors.New("--sasl-user, --sasl-password-file: not used with --sasl-mechanism OAUTHBEARER (--sasl-token-file is)")
		}
		if _, err := readSecret(s.SASLTokenFile, "--sasl-token-file"); err != nil {
			return err
		}
		c.Net.SASL.Mechanism = sarama.SASLTypeOAuth
		c.Net.SASL.TokenProvider = fileToken(s.SASLTokenFile)
	default:
		return fmt.Errorf("--sasl-mechanism: want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER, got %q", s.SASLMechanism)
	}
	return nil
}

func (s Security) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca-file: %s holds no PEM certificate", s.CAFile)
		}
		tc.RootCAs = pool
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return nil, errors.New("--tls-cert-file and --tls-key-file: give both or neither")
	}
	if s.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file/--tls-key-file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func readSecret(path, flag string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s: required", flag)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, path)
	}
	return secret, nil
}

// fileToken reads the OAUTHBEARER token from a file at each connection.
type fileToken string

func (f fileToken) Token() (*sarama.AccessToken, error) {
	t, err := readSecret(string(f), "--sasl-token-file")
	if err != nil {
		return nil, err
	}
	return &sarama.AccessToken{Token: t}, nil
}

// scramClient adapts xdg-go/scram to Sarama's SCRAMClient, as Sarama's own
// examples do.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	client, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = client.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }
func (c *scramClient) Done() bool                            { return c.conv.Done() }

// Explain adds what to check to a connection error: some brokers (kfake
// among them) close the connection on a failed SASL authentication, which
// Sarama reports only as "run out of available brokers: EOF".
func (s Security) Explain(err error) error {
	if err == nil {
		return nil
	}
	var hints []string
	if errors.Is(err, sarama.ErrSASLAuthenticationFailed) || (s.SASLMechanism != "" && errors.Is(err, sarama.ErrOutOfBrokers)) {
		hints = append(hints, fmt.Sprintf("SASL %s authentication may have failed: check --sasl-user and --sasl-password-file (or --sasl-token-file)", strings.ToUpper(s.SASLMechanism)))
	}
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknown):
		hints = append(hints, "the broker's certificate is not signed by a trusted authority: check --tls-ca-file")
	case errors.As(err, &hostname):
		hints = append(hints, "the broker's certificate does not name the broker's address: check --tls-server-name")
	case !s.TLS && errors.Is(err, sarama.ErrOutOfBrokers):
		hints = append(hints, "if the brokers require TLS, set --tls")
	}
	if len(hints) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(hints, "; "))
}

// WarnPlaintext logs one warning when SASL is on without TLS and a broker
// is off this machine: PLAIN sends the password itself in clear, and every
// mechanism leaves the session unencrypted (SCRAM's and OAUTHBEARER's
// secrets, and every prompt and event, readable and alterable on the
// way). Loopback addresses (and "localhost") stay on the machine. Called
// once at start, as the Postgres connection's warning is.
func (s Security) WarnPlaintext(ctx context.Context, log *slog.Logger, brokers []string) {
	if s.SASLMechanism == "" || s.TLS {
		return
	}
	if !slices.ContainsFunc(brokers, func(b string) bool { return !loopback(b) }) {
		return
	}
	log.WarnContext(ctx, "SASL without TLS to brokers off this machine: the credentials and all traffic travel unencrypted; set --tls (docs/deploy.md)",
		slog.String("mechanism", strings.ToUpper(s.SASLMechanism)), slog.Any("brokers", brokers))
}

// loopback reports whether a broker address host:port stays on this
// machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckBrokerAddr checks a --brokers entry: host:port, with a port
// number. A bad one stops the program at its flags, before it connects
// to anything.
func CheckBrokerAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return fmt.Errorf("--brokers: %q is not host:port", addr)
	}
	return nil
}
