package recovery_test

import (
	"flag"
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) {
	// The recovery state machine runs real executors through crashes: 25
	// sequences keep the default suite near ten seconds here; pass
	// -rapid.checks=N for a longer hunt.
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if !explicit {
		_ = flag.Set("rapid.checks", "25")
	}
	testkit.Main(m)
}
