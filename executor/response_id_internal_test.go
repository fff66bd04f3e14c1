package executor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A provider's response ID is stored as given, less what cannot be stored
// or shown: surrounding space, control characters (dropped, not
// replaced), invalid UTF-8; and it is cut to responseIDMaxBytes on a rune
// boundary.
func TestCleanResponseID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("r", responseIDMaxBytes)
	for _, c := range []struct{ in, want string }{
		{"resp_123", "resp_123"},
		{"  resp 1\t\n", "resp 1"},
		{"a\x00b\x01c\x1fd\x7fe", "abcde"},
		{"a\xffb", "ab"},
		{"é ~", "é ~"},
		{long, long},
		{long + "s", long},
		{strings.Repeat("r", responseIDMaxBytes-1) + "é", strings.Repeat("r", responseIDMaxBytes-1)},
		{"\x01\x02", ""},
	} {
		require.Equal(t, c.want, cleanResponseID(c.in), "%q", c.in)
	}
}

// TestKeepResponseIDHoldsOneAttempt: an execution kept busy turn after
// turn keeps the response ID of its attempt in flight only; those of its
// settled attempts are dropped, so what it holds does not grow with the
// turns it runs.
func TestKeepResponseIDHoldsOneAttempt(t *testing.T) {
	t.Parallel()
	ex := &execution{}
	for i := range 1000 {
		a := fmt.Sprintf("exec/%d", i+1)
		ex.keepResponseID(a, "resp-"+a)
		require.Equal(t, "resp-"+a, ex.responseIDs[a], "the attempt in flight keeps its ID")
		require.Len(t, ex.responseIDs, 1, "after attempt %d", i+1)
		if i%2 == 0 {
			// A second try of the same attempt replaces its ID.
			ex.keepResponseID(a, "resp-again-"+a)
			require.Equal(t, "resp-again-"+a, ex.responseIDs[a])
			require.Len(t, ex.responseIDs, 1)
		}
	}
	// A try that reported none forgets the attempt's earlier try's.
	ex.keepResponseID("exec/1000", "")
	require.Empty(t, ex.responseIDs)
}
