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
		// rapid runs a fifth of the checks under -short (make test/short);
		// the fast tier runs the same 25, so that the machine's
		// non-vacuity checks hold there too.
		checks := "25"
		if testing.Short() {
			checks = "125"
		}
		_ = flag.Set("rapid.checks", checks)
	}
	testkit.Main(m)
}
