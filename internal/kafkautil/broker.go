package kafkautil

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// The tests' broker switch (testkit.Broker): PROMPTLINE_TEST_KAFKA=apache
// gives tests Apache Kafka, PROMPTLINE_TEST_KAFKA_JVMS bounds its nodes at
// once. They are not settings: the programs ignore them (TestEnvVars), so
// that the processes a test starts inherit them harmlessly.
const (
	TestKafkaEnv     = "PROMPTLINE_TEST_KAFKA"
	TestKafkaJVMsEnv = "PROMPTLINE_TEST_KAFKA_JVMS"
)

// TestEnvVars lists the variables of the tests' broker switch.
var TestEnvVars = []string{TestKafkaEnv, TestKafkaJVMsEnv}

// BrokerConfig configures the embedded broker.
type BrokerConfig struct {
	// Addr is the TCP address to listen on. Defaults to "127.0.0.1:9092";
	// use port 0 for a free port.
	Addr string
	// DataDir keeps topic data across restarts when set. Defaults to none
	// (in memory).
	DataDir string
	// Partitions of the topics seeded at start. Defaults to 16.
	Partitions int32
	// Topics seeded at start. Defaults to none.
	Topics []string
	// TLS, when set, makes the broker speak TLS only. Defaults to plaintext.
	TLS *tls.Config
	// SASLUsers, when set, requires SASL authentication (PLAIN,
	// SCRAM-SHA-256 or SCRAM-SHA-512). Defaults to none.
	SASLUsers []SASLUser
}

// SASLUser is a user of the embedded broker.
type SASLUser struct{ Mechanism, User, Password string }

// Broker is the embedded single-node Kafka-protocol broker: franz-go's
// kfake, listening on a real TCP port. Clients reach it only over TCP.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
}

// StartBroker starts the embedded broker; Close stops it.
func StartBroker(cfg BrokerConfig) (*Broker, error) {
	addr := cmp.Or(cfg.Addr, "127.0.0.1:9092")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("embedded Kafka broker: listening on %s: %w", addr, err)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(func(string, string) (net.Listener, error) { return ln, nil }),
		kfake.DefaultNumPartitions(int(cmp.Or(cfg.Partitions, 16))),
		// Tests run consumer groups with short sessions.
		kfake.GroupMinSessionTimeout(0),
	}
	if len(cfg.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(cmp.Or(cfg.Partitions, 16), cfg.Topics...))
	}
	if cfg.TLS != nil {
		opts = append(opts, kfake.TLS(cfg.TLS))
	}
	if len(cfg.SASLUsers) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range cfg.SASLUsers {
			opts = append(opts, kfake.Superuser(u.Mechanism, u.User, u.Password))
		}
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("embedded Kafka broker: %w", err)
	}
	return &Broker{cluster: c, addr: ln.Addr().String()}, nil
}

// Addr is the bootstrap address.
func (b *Broker) Addr() string { return b.addr }

// Close stops the broker.
func (b *Broker) Close() { b.cluster.Close() }
