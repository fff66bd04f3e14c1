package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
)

// numericFits says what PostgreSQL's jsonb says of a JSON number, at the
// edges of numeric's range and past them: each number is given to the
// server too, and the two must agree.
//
// It catches: a bound off by one, or an exponent counted the wrong way,
// either of which would let a response through that jsonb refuses (its
// answer left unrecorded) or turn a storable input into a string.
func TestNumericFitsAsJSONBDoes(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	digits := func(n int) string { return "1" + strings.Repeat("0", n-1) }
	for _, n := range []string{
		"0", "-0.5", "12.5e1", "1e131071", "1e131072", "-1e+131071", "9.99e131071", "1e-16383", "1e-16384",
		"0.5e-16382", "0.5e-16383", "123.456e-16380", "123.456e-16381", "0.00001e131076", "0.00001e131077", "0e-16384", "0e131073", "1.000e-16380", "1.0000e-16380", "1e0000000001",
		"1e99999999999999999999", "1e-99999999999999999999", digits(131072), digits(131073),
		"0." + strings.Repeat("1", 16383), "0." + strings.Repeat("1", 7000) + "e-9999", "0." + strings.Repeat("1", 6384) + "e-9999", "0." + strings.Repeat("1", 999) + "e-999", "0." + strings.Repeat("1", 16384), "1.5e-20000", "1e1000000",
	} {
		var ok bool
		_, err := pool.Exec(context.Background(), `SELECT $1::jsonb`, n)
		ok = err == nil
		show := n
		if len(show) > 40 {
			show = show[:20] + "…" + show[len(show)-10:]
		}
		require.Equal(t, ok, numericFits(n), "%s: jsonb says %v (%v)", show, ok, err)
		// And through storableJSON, which must find it by its scan.
		in := json.RawMessage(`{"n": ` + n + `}`)
		out := storableJSON(in)
		if ok {
			var want, got bytes.Buffer
			require.NoError(t, json.Compact(&want, in))
			require.NoError(t, json.Compact(&got, out))
			require.Equal(t, want.String(), got.String(), "%s: kept as it is (its spaces aside)", show)
		} else {
			var s string
			require.NoError(t, json.Unmarshal(out, &s), "%s: kept as a string", show)
			require.Equal(t, string(in), s)
		}
	}
}

// Call IDs the provider saw as distinct stay distinct once storable: a
// NUL and an invalid byte both become U+FFFD.
func TestStorableResponseKeepsCallIDsDistinct(t *testing.T) {
	t.Parallel()
	r := storableResponse(provider.Response{ToolCalls: []provider.ToolCall{
		{ID: "a\x00", Name: "echo", Input: json.RawMessage(`{}`)},
		{ID: "a\xff", Name: "echo", Input: json.RawMessage(`{}`)},
		{ID: "a\uFFFD", Name: "echo", Input: json.RawMessage(`{}`)},
		{ID: "b", Name: "echo", Input: json.RawMessage(`{}`)},
	}})
	var ids []string
	for _, c := range r.ToolCalls {
		ids = append(ids, c.ID)
	}
	require.Equal(t, []string{"a\uFFFD", "a\uFFFD~2", "a\uFFFD~3", "b"}, ids)
}
