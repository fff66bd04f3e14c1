package apachekafka

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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

// The storage tool reads a cluster ID that starts with '-' as an option
// ("argument --cluster-id/-t: expected one argument"): one format in 64
// failed so, once per machine (the formatted storage is cached). The
// script's cluster_id must never make one.
func TestClusterIDNeverLooksLikeAnOption(t *testing.T) {
	t.Parallel()
	script, err := Script()
	if err != nil {
		t.Fatal(err)
	}
	const n = 500 // the old script made a bad one in 500 with probability 1-(63/64)^500 > 99.9%
	out, err := exec.Command("bash", "-c", `source <(sed -n '/^cluster_id()/,/^}/p' "$1") && for i in $(seq 1 `+strconv.Itoa(n)+`); do cluster_id; echo; done`, "bash", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(string(out))
	if len(ids) != n {
		t.Fatalf("%d cluster IDs, want %d", len(ids), n)
	}
	valid := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{21}$`)
	for _, id := range ids {
		if !valid.MatchString(id) {
			t.Fatalf("cluster ID %q: not 22 URL-safe base64 characters, or starts with '-'", id)
		}
	}
}
