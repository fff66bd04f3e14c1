package apachekafka

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPortTaken(t *testing.T) {
	node := t.TempDir()
	if err := os.MkdirAll(filepath.Join(node, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(node, "logs", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("server.log", "ERROR Exiting Kafka due to fatal exception during startup.\n")
	if PortTaken(node) {
		t.Fatal("another startup failure read as a taken port")
	}
	write("stdout.log", "Caused by: java.net.BindException: Address already in use\n")
	if !PortTaken(node) {
		t.Fatal("a BindException in stdout.log not read as a taken port")
	}
}

func TestScriptFoundFromAPackageDirectory(t *testing.T) {
	s, err := Script()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(s) != "kafka.sh" || filepath.Base(filepath.Dir(s)) != "scripts" {
		t.Fatalf("Script() = %s", s)
	}
}
