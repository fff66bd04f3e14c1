package executor

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// A panic's value is kept whole up to panicValueMaxBytes, and past it cut
// to at most that many bytes, on a rune's start, marked as cut: it goes
// into the call's or the attempt's error text, which Postgres stores as
// text.
func TestPanicTextIsBounded(t *testing.T) {
	t.Parallel()
	exact := strings.Repeat("p", panicValueMaxBytes)
	require.Equal(t, exact, panicText(exact), "a value of the bound itself is whole")

	long := strings.Repeat("q", 3*panicValueMaxBytes)
	cut := panicText(long)
	require.LessOrEqual(t, len(cut), panicValueMaxBytes)
	require.True(t, strings.HasSuffix(cut, "…[truncated]"), cut)
	require.True(t, strings.HasPrefix(long, strings.TrimSuffix(cut, "…[truncated]")))

	// Four-byte runes from the first byte: the cut falls inside one and
	// moves back to its start.
	runes := strings.Repeat("😀", panicValueMaxBytes)
	for shift := range 4 {
		v := strings.Repeat("r", shift) + runes
		cut := panicText(v)
		require.True(t, utf8.ValidString(cut), "shift %d: %q", shift, cut[max(0, len(cut)-20):])
		require.LessOrEqual(t, len(cut), panicValueMaxBytes, "shift %d", shift)
		require.True(t, strings.HasPrefix(v, strings.TrimSuffix(cut, "…[truncated]")), "shift %d", shift)
	}
}

// A NUL anywhere, the first byte included, is not storable.
func TestStorableReplacesALeadingNUL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "\uFFFDanswer", storable("\x00answer"))
	require.Equal(t, "an\uFFFDswer", storable("an\x00swer"))
	require.Equal(t, "answer", storable("answer"))
}
