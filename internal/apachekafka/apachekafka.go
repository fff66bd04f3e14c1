// Package apachekafka holds what the tests (internal/testkit) and the
// benchmark (cmd/bench) share to run Apache Kafka nodes from the jars that
// scripts/kafka.sh resolves: where the script is, and how to tell that a
// node could not bind its port. It is development tooling; the consumer
// never imports it.
package apachekafka

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Script returns the path of the repository's scripts/kafka.sh, found
// from the working directory upwards (a test runs in its package's
// directory, the benchmark anywhere inside the repository).
func Script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			s := filepath.Join(dir, "scripts", "kafka.sh")
			if _, err := os.Stat(s); err != nil {
				return "", fmt.Errorf("running Apache Kafka needs the repository's scripts/kafka.sh: %w", err)
			}
			return s, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("running Apache Kafka needs the repository: no go.mod above the working directory")
		}
		dir = parent
	}
}

// PortTaken says whether the node whose directory (scripts/kafka.sh
// prepare's node-N) is nodeDir failed because its port was taken: ports
// are free when chosen and bound by the JVM seconds later, and another
// process can take one in between. Such a start is worth trying again on
// new ports.
func PortTaken(nodeDir string) bool {
	for _, f := range []string{"server.log", "stdout.log"} {
		b, err := os.ReadFile(filepath.Join(nodeDir, "logs", f))
		if err == nil && strings.Contains(string(b), "Address already in use") {
			return true
		}
	}
	return false
}
