package executor

import (
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
