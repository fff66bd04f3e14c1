package executor

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/promptline/promptline/provider"
)

// What the executor stores from outside — a model's answer and tool
// calls, a tool's output, an error's text — may be what Postgres refuses:
// bytes that are not UTF-8 (a tool's body in latin-1), a NUL (a model's
// "\u0000"), in text and jsonb alike, or a tool input that is not JSON.
// Refused with a data error, a result the executor holds would go
// unrecorded: the claim left to expire with the call or the attempt
// started, which recovery can only make unknown (P4), or an idempotent
// tool run again, for bad data (P6). So it is made storable first, at the
// boundary, with U+FFFD where a decoder would show one.

// storable returns s as a text column takes it: valid UTF-8 without NUL.
func storable(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storableJSON returns b as a jsonb column takes it: b itself when it is
// JSON with no NUL escaped in a string (jsonb refuses "\u0000"); its
// strings made storable when it has one; else, not being JSON, or having a
// number jsonb's numeric cannot hold (numericFits), b's text as one JSON
// string (the call then fails its tool's input schema, recorded).
func storableJSON(b json.RawMessage) json.RawMessage {
	if !json.Valid(b) {
		out, _ := json.Marshal(storable(string(b))) // a string always marshals
		return out
	}
	if !bytes.Contains(b, []byte(`\u0000`)) && !escapedSurrogate.Match(b) && !mayHoldBigNumber(b) {
		return b
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // numbers as written
	var v any
	if err := d.Decode(&v); err != nil || !numbersFit(v) {
		out, _ := json.Marshal(storable(string(b)))
		return out
	}
	out, err := json.Marshal(storableValue(v))
	if err != nil {
		out, _ = json.Marshal(storable(string(b)))
	}
	return out
}

// escapedSurrogate finds a \u escape of a UTF-16 surrogate, which jsonb
// refuses unless it is half of a pair, and which Go's decoder accepts
// alone (as U+FFFD): such an input is decoded and encoded again, a pair
// then written as its character. (A backslash escaped before the u makes
// a false match, which costs a decode and changes nothing.)
var escapedSurrogate = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// mayHoldBigNumber reports whether b may hold a number jsonb's numeric
// refuses (numericFits): a run of a thousand digits or more, or an
// exponent of four digits or more (leading zeros aside). Without either,
// a number's integer part and fraction are under a thousand digits each
// and its exponent under 10,000, so it fits. Such an input is decoded and
// its numbers checked; a match inside a string costs a decode and changes
// nothing. (A scan, not a regexp: Go's regexps repeat at most a thousand
// times.)
func mayHoldBigNumber(b []byte) bool {
	run := 0
	for i, c := range b {
		if c >= '0' && c <= '9' {
			if run++; run >= 1000 {
				return true
			}
			continue
		}
		run = 0
		if c != 'e' && c != 'E' {
			continue
		}
		j := i + 1
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		for j < len(b) && b[j] == '0' {
			j++
		}
		k := j
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			k++
		}
		if k-j >= 4 {
			return true
		}
	}
	return false
}

// numbersFit reports whether every number in v (decoded with UseNumber)
// fits jsonb's numeric (numericFits).
func numbersFit(v any) bool {
	switch v := v.(type) {
	case json.Number:
		return numericFits(string(v))
	case []any:
		for _, e := range v {
			if !numbersFit(e) {
				return false
			}
		}
	case map[string]any:
		for _, e := range v {
			if !numbersFit(e) {
				return false
			}
		}
	}
	return true
}

// PostgreSQL's numeric holds at most 131,072 digits before the decimal
// point and 16,383 after it; a JSON number past either is refused by
// jsonb ("value overflows numeric format") though Go's decoder takes it,
// and a response whose tool call carried one could not be recorded: its
// attempt left started, recovery could only call the turn's outcome
// unknown (P6: bad data is recorded, not a crash of the turn).
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
)

// numericFits reports whether the JSON number n (valid JSON) fits
// numeric as PostgreSQL reads it: its integer digits counted from the
// first significant digit, the point moved by the exponent; its fraction's
// digits as written (trailing zeros too), less the exponent.
func numericFits(n string) bool {
	mant, exp := n, int64(0)
	if i := strings.IndexAny(n, "eE"); i >= 0 {
		mant = n[:i]
		e, err := strconv.ParseInt(strings.TrimPrefix(n[i+1:], "+"), 10, 64)
		if err != nil || e > 1<<40 || e < -(1<<40) {
			return false // beyond any numeric, and beyond int64's arithmetic below
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(strings.TrimPrefix(mant, "-"), ".")
	digits := intPart + frac
	zeros := int64(len(digits) - len(strings.TrimLeft(digits, "0")))
	intDigits := int64(len(intPart)) - zeros + exp
	if zeros == int64(len(digits)) {
		intDigits = 0 // zero
	}
	fracDigits := int64(len(frac)) - exp
	return intDigits <= numericMaxIntDigits && fracDigits <= numericMaxFracDigits
}

func storableValue(v any) any {
	switch v := v.(type) {
	case string:
		return storable(v)
	case []any:
		for i := range v {
			v[i] = storableValue(v[i])
		}
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[storable(k)] = storableValue(e)
		}
		return out
	}
	return v
}

// storableResponse makes a provider's response storable (storable,
// storableJSON): its text and each tool call's ID, name and input.
func storableResponse(r provider.Response) provider.Response {
	r.Text = storable(r.Text)
	if len(r.ToolCalls) > 0 {
		calls := make([]provider.ToolCall, len(r.ToolCalls))
		taken := make(map[string]bool, len(r.ToolCalls))
		for i, c := range r.ToolCalls {
			// Two IDs the provider saw as distinct ("a\x00", "a\uFFFD")
			// can be one once made storable: the second gets a suffix, so
			// that each call keeps a result of its own.
			base := storable(c.ID)
			id := base
			for n := 2; taken[id]; n++ {
				id = base + "~" + strconv.Itoa(n)
			}
			taken[id] = true
			calls[i] = provider.ToolCall{ID: id, Name: storable(c.Name), Input: storableJSON(c.Input)}
		}
		r.ToolCalls = calls
	}
	return r
}
