package envelope_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

func boolPtr(b bool) *bool { return &b }

// allReasons is every Reason constant. ReasonConflict is never returned by
// Decode (it takes Postgres to see a conflicting reuse) but is a valid
// reject reason all the same.
var allReasons = []string{
	envelope.ReasonTooLarge,
	envelope.ReasonInvalidJSON,
	envelope.ReasonMissingField,
	envelope.ReasonInvalidField,
	envelope.ReasonUnknownField,
	envelope.ReasonKeyMismatch,
	envelope.ReasonConflict,
	envelope.ReasonInvalidUTF8,
	envelope.ReasonTrailingBytes,
	envelope.ReasonTooDeep,
	envelope.ReasonUnknownRequest,
	envelope.ReasonTooManyHeaders,
	envelope.ReasonHeadersTooLarge,
	envelope.ReasonDataError,
}

func TestDecode(t *testing.T) {
	t.Parallel()

	id128 := strings.Repeat("a", 128)

	accepted := []struct {
		name   string
		key    []byte
		value  string
		limits envelope.Limits
		want   envelope.Prompt
	}{
		{
			name:  "Defaults",
			key:   []byte("s1"),
			value: `{"message_id":"m1","session_id":"s1","text":"hello"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "KeyAbsent",
			key:   nil,
			value: `{"message_id":"m1","session_id":"s1","text":"hello"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "QueueExplicit",
			value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":"queue"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "Steer",
			key:   []byte("s1"),
			value: `{"message_id":"m1","session_id":"s1","text":"stop","delivery":"steer"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "stop", Delivery: envelope.DeliverySteer},
		},
		{
			name:  "ResumeFalse",
			value: `{"message_id":"m1","session_id":"s1","text":"hello","resume":false}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue, Resume: boolPtr(false)},
		},
		{
			name:  "ResumeTrue",
			value: `{"message_id":"m1","session_id":"s1","text":"hello","resume":true}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue, Resume: boolPtr(true)},
		},
		{
			name:  "MembersInAnyOrderWithWhitespace",
			value: " \n{ \"resume\" : false,\t\"text\":\"hi\", \"delivery\":\"steer\", \"session_id\":\"s1\", \"message_id\":\"m1\" }\r\n ",
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hi", Delivery: envelope.DeliverySteer, Resume: boolPtr(false)},
		},
		{
			name:  "IDLength128",
			key:   []byte(id128),
			value: `{"message_id":"` + id128 + `","session_id":"` + id128 + `","text":"x"}`,
			want:  envelope.Prompt{MessageID: id128, SessionID: id128, Text: "x", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "IDAllPrintableASCII",
			value: `{"message_id":"!~09AZaz{}[]\"\\/:","session_id":"s1","text":"x"}`,
			want:  envelope.Prompt{MessageID: `!~09AZaz{}[]"\/:`, SessionID: "s1", Text: "x", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "EscapedMemberName",
			value: `{"message\u005fid":"m1","session_id":"s1","text":"x"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "x", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "UnicodeText",
			value: `{"message_id":"m1","session_id":"s1","text":"héllo, 世界 \ud83d\ude00\n\t\"q\""}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "héllo, 世界 😀\n\t\"q\"", Delivery: envelope.DeliveryQueue},
		},
		{
			// An escaped backslash followed by "ud800" is text, not an escape.
			name:  "EscapedBackslashBeforeU",
			value: `{"message_id":"m1","session_id":"s1","text":"\\ud800\\\\\ud83d\ude00"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: `\ud800\\😀`, Delivery: envelope.DeliveryQueue},
		},
		{
			// The lowest low surrogate completes a pair: U+10000.
			name:  "SurrogatePairAtLowEdges",
			value: `{"message_id":"m1","session_id":"s1","text":"\ud800\udc00"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "\U00010000", Delivery: envelope.DeliveryQueue},
		},
		{
			name:  "SurrogatePairAtHighEdges",
			value: `{"message_id":"m1","session_id":"s1","text":"\udbff\udfff"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "\U0010FFFF", Delivery: envelope.DeliveryQueue},
		},
		{
			// U+E000 follows the surrogates: an escape of it is no half of a pair.
			name:  "EscapeJustAboveSurrogates",
			value: `{"message_id":"m1","session_id":"s1","text":"\ue000"}`,
			want:  envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "\ue000", Delivery: envelope.DeliveryQueue},
		},
		{
			name:   "TextExactlyAtTextLimit",
			value:  `{"message_id":"m1","session_id":"s1","text":"hello"}`,
			limits: envelope.Limits{MaxTextBytes: 5},
			want:   envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue},
		},
		{
			name:   "ExactlyAtSizeLimit",
			value:  `{"message_id":"m1","session_id":"s1","text":"x"}`,
			limits: envelope.Limits{MaxValueBytes: len(`{"message_id":"m1","session_id":"s1","text":"x"}`)},
			want:   envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "x", Delivery: envelope.DeliveryQueue},
		},
		{
			name:   "CustomIDLengthAtLimit",
			value:  `{"message_id":"abcd","session_id":"s1","text":"x"}`,
			limits: envelope.Limits{MaxIDLength: 4},
			want:   envelope.Prompt{MessageID: "abcd", SessionID: "s1", Text: "x", Delivery: envelope.DeliveryQueue},
		},
	}
	for _, tt := range accepted {
		t.Run("Accepts"+tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := envelope.Decode(tt.key, []byte(tt.value), tt.limits)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}

	const ok = `{"message_id":"m1","session_id":"s1","text":"hello"}`
	rejected := []struct {
		name   string
		key    []byte
		value  string
		limits envelope.Limits
		reason string
	}{
		// too_large
		{name: "TooLargeCustomLimit", value: ok, limits: envelope.Limits{MaxValueBytes: len(ok) - 1}, reason: envelope.ReasonTooLarge},
		{name: "TooLargeDefaultLimit", value: `{"message_id":"m1","session_id":"s1","text":"` + strings.Repeat("x", 1<<20) + `"}`, reason: envelope.ReasonTooLarge},
		{name: "TooLargeBeforeAnythingElse", value: "\xff not json at all", limits: envelope.Limits{MaxValueBytes: 4}, reason: envelope.ReasonTooLarge},

		// invalid_utf8
		{name: "InvalidUTF8InText", value: "{\"message_id\":\"m1\",\"session_id\":\"s1\",\"text\":\"\xff\xfe\"}", reason: envelope.ReasonInvalidUTF8},
		{name: "InvalidUTF8TruncatedRune", value: "{\"message_id\":\"m1\",\"session_id\":\"s1\",\"text\":\"\xe4\xb8\"}", reason: envelope.ReasonInvalidUTF8},
		{name: "InvalidUTF8OutsideStrings", value: "\xef\xbb" + ok, reason: envelope.ReasonInvalidUTF8},
		{name: "UnpairedHighSurrogate", value: `{"message_id":"m1","session_id":"s1","text":"a\ud800b"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "UnpairedLowSurrogate", value: `{"message_id":"m1","session_id":"s1","text":"\udc00"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "ReversedSurrogatePair", value: `{"message_id":"m1","session_id":"s1","text":"\ude00\ud83d"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "HighSurrogateBeforeNonSurrogateEscape", value: `{"message_id":"m1","session_id":"s1","text":"\ud800\ue000"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "HighSurrogateBeforeHighSurrogate", value: `{"message_id":"m1","session_id":"s1","text":"\ud800\udbff"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "LowSurrogateBeforeLowSurrogate", value: `{"message_id":"m1","session_id":"s1","text":"\udc00\udc00"}`, reason: envelope.ReasonInvalidUTF8},
		{name: "HighSurrogateAtEnd", value: `{"message_id":"m1","session_id":"s1","text":"x\ud83d"}`, reason: envelope.ReasonInvalidUTF8},

		// invalid_json
		{name: "Empty", value: ``, reason: envelope.ReasonInvalidJSON},
		{name: "OnlyWhitespace", value: " \n\t", reason: envelope.ReasonInvalidJSON},
		{name: "Null", value: `null`, reason: envelope.ReasonInvalidJSON},
		{name: "Array", value: `[` + ok + `]`, reason: envelope.ReasonInvalidJSON},
		{name: "String", value: `"hello"`, reason: envelope.ReasonInvalidJSON},
		{name: "Number", value: `42`, reason: envelope.ReasonInvalidJSON},
		{name: "Truncated", value: ok[:len(ok)-1], reason: envelope.ReasonInvalidJSON},
		{name: "TrailingComma", value: `{"message_id":"m1","session_id":"s1","text":"hello",}`, reason: envelope.ReasonInvalidJSON},
		{name: "MissingColon", value: `{"message_id" "m1","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidJSON},
		{name: "SingleQuotes", value: `{'message_id':'m1'}`, reason: envelope.ReasonInvalidJSON},
		{name: "RawControlCharInString", value: "{\"message_id\":\"m1\",\"session_id\":\"s1\",\"text\":\"a\nb\"}", reason: envelope.ReasonInvalidJSON},
		{name: "ByteOrderMark", value: "\ufeff" + ok, reason: envelope.ReasonInvalidJSON},
		{name: "RepeatedMember", value: `{"message_id":"m1","session_id":"s1","text":"hello","text":"bye"}`, reason: envelope.ReasonInvalidJSON},
		{name: "RepeatedMemberEscaped", value: `{"message_id":"m1","message\u005fid":"m2","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidJSON},

		// trailing_data
		{name: "SecondObject", value: ok + `{}`, reason: envelope.ReasonTrailingBytes},
		{name: "SecondObjectAfterSpace", value: ok + " \n" + ok, reason: envelope.ReasonTrailingBytes},
		{name: "TrailingGarbage", value: ok + `x`, reason: envelope.ReasonTrailingBytes},
		{name: "TrailingBrace", value: ok + `}`, reason: envelope.ReasonTrailingBytes},
		{name: "TrailingBracket", value: ok + `]`, reason: envelope.ReasonTrailingBytes},
		{name: "TrailingNull", value: ok + ` null`, reason: envelope.ReasonTrailingBytes},

		// too_deep: checked before decoding, far below Go's 10,000.
		{name: "DeepNesting10001", value: `{"message_id":"m1","session_id":"s1","text":"x","resume":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, reason: envelope.ReasonTooDeep},
		{name: "DeepNesting17", value: `{"message_id":"m1","session_id":"s1","text":"x","resume":` + strings.Repeat("[", 16) + strings.Repeat("]", 16) + `}`, reason: envelope.ReasonTooDeep},
		// Nesting exactly at the limit (16, the object included) is not
		// too deep: resume is then only of the wrong type.
		{name: "NestingAtLimit16", value: `{"message_id":"m1","session_id":"s1","text":"x","resume":` + strings.Repeat("[", 15) + strings.Repeat("]", 15) + `}`, reason: envelope.ReasonInvalidField},
		// Closing brackets lower the depth: many shallow siblings are not deep.
		{name: "ManyShallowSiblings", value: `{"message_id":"m1","session_id":"s1","text":"x","resume":[` + strings.Repeat("[],{},", 20) + `[]]}`, reason: envelope.ReasonInvalidField},
		// Brackets inside strings do not nest, escaped quotes do not end them.
		{name: "BracketsInStrings", value: `{"message_id":"m1","session_id":"s1","text":"\"` + strings.Repeat("[", 20) + `","resume":"` + strings.Repeat("{", 20) + `"}`, reason: envelope.ReasonInvalidField},
		{name: "TextOverTextLimit", value: `{"message_id":"m1","session_id":"s1","text":"hello"}`, reason: envelope.ReasonTooLarge, limits: envelope.Limits{MaxTextBytes: 4}},

		// missing_field
		{name: "MissingMessageID", value: `{"session_id":"s1","text":"hello"}`, reason: envelope.ReasonMissingField},
		{name: "MissingSessionID", value: `{"message_id":"m1","text":"hello"}`, reason: envelope.ReasonMissingField},
		{name: "MissingText", value: `{"message_id":"m1","session_id":"s1"}`, reason: envelope.ReasonMissingField},
		{name: "EmptyObject", value: `{}`, reason: envelope.ReasonMissingField},

		// unknown_field
		{name: "UnknownField", value: `{"message_id":"m1","session_id":"s1","text":"hello","priority":1}`, reason: envelope.ReasonUnknownField},
		{name: "UnknownFieldOnly", value: `{"x":null}`, reason: envelope.ReasonUnknownField},
		{name: "NameInOtherCase", value: `{"Message_ID":"m1","session_id":"s1","text":"hello"}`, reason: envelope.ReasonUnknownField},
		{name: "NameInOtherCaseBesideRightOne", value: `{"message_id":"m1","MESSAGE_ID":"m2","session_id":"s1","text":"hello"}`, reason: envelope.ReasonUnknownField},

		// invalid_field: wrong types
		{name: "MessageIDNumber", value: `{"message_id":1,"session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "SessionIDObject", value: `{"message_id":"m1","session_id":{},"text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "TextArray", value: `{"message_id":"m1","session_id":"s1","text":["hello"]}`, reason: envelope.ReasonInvalidField},
		{name: "TextBool", value: `{"message_id":"m1","session_id":"s1","text":true}`, reason: envelope.ReasonInvalidField},
		{name: "DeliveryNumber", value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":1}`, reason: envelope.ReasonInvalidField},
		{name: "ResumeString", value: `{"message_id":"m1","session_id":"s1","text":"hello","resume":"true"}`, reason: envelope.ReasonInvalidField},
		{name: "ResumeNumber", value: `{"message_id":"m1","session_id":"s1","text":"hello","resume":1}`, reason: envelope.ReasonInvalidField},

		// invalid_field: null is a wrong type, not an absent field
		{name: "NullMessageID", value: `{"message_id":null,"session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "NullSessionID", value: `{"message_id":"m1","session_id":null,"text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "NullText", value: `{"message_id":"m1","session_id":"s1","text":null}`, reason: envelope.ReasonInvalidField},
		{name: "NullDelivery", value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":null}`, reason: envelope.ReasonInvalidField},
		{name: "NullResume", value: `{"message_id":"m1","session_id":"s1","text":"hello","resume":null}`, reason: envelope.ReasonInvalidField},

		// invalid_field: values
		{name: "EmptyText", value: `{"message_id":"m1","session_id":"s1","text":""}`, reason: envelope.ReasonInvalidField},
		{name: "NULInText", value: `{"message_id":"m1","session_id":"s1","text":"a\u0000b"}`, reason: envelope.ReasonInvalidField},
		{name: "NULStartsText", value: `{"message_id":"m1","session_id":"s1","text":"\u0000b"}`, reason: envelope.ReasonInvalidField},
		{name: "EmptyMessageID", value: `{"message_id":"","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "EmptySessionID", value: `{"message_id":"m1","session_id":"","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "MessageIDLength129", value: `{"message_id":"` + id128 + `b","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "SessionIDLength129", value: `{"message_id":"m1","session_id":"` + id128 + `b","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "CustomIDLengthExceeded", value: `{"message_id":"abcde","session_id":"s1","text":"x"}`, limits: envelope.Limits{MaxIDLength: 4}, reason: envelope.ReasonInvalidField},
		{name: "IDWithSpace", value: `{"message_id":"m 1","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "IDWithEscapedTab", value: `{"message_id":"m\t1","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "IDWithNUL", value: `{"message_id":"m1","session_id":"s\u00001","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "IDWithDEL", value: `{"message_id":"m\u007f","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "IDNonASCII", value: `{"message_id":"mé","session_id":"s1","text":"hello"}`, reason: envelope.ReasonInvalidField},
		{name: "DeliveryUnknown", value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":"later"}`, reason: envelope.ReasonInvalidField},
		{name: "DeliveryWrongCase", value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":"QUEUE"}`, reason: envelope.ReasonInvalidField},
		{name: "DeliveryEmpty", value: `{"message_id":"m1","session_id":"s1","text":"hello","delivery":""}`, reason: envelope.ReasonInvalidField},

		// key_mismatch
		{name: "KeyMismatch", key: []byte("s2"), value: ok, reason: envelope.ReasonKeyMismatch},
		{name: "KeyPrefixOfSession", key: []byte("s"), value: ok, reason: envelope.ReasonKeyMismatch},
		// An empty key is present (Kafka tells a null key from an empty
		// one), and no session ID is empty.
		{name: "KeyEmptyButPresent", key: []byte{}, value: ok, reason: envelope.ReasonKeyMismatch},
		// A broken prompt is rejected for what is wrong with it, whatever
		// its key.
		{name: "KeyMismatchOnBrokenPrompt", key: []byte("s2"), value: `{"message_id":"m1","session_id":"s1"}`, reason: envelope.ReasonMissingField},
	}
	for _, tt := range rejected {
		t.Run("Rejects"+tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := envelope.Decode(tt.key, []byte(tt.value), tt.limits)
			require.Error(t, err)
			require.Zero(t, got, "a rejected prompt must come back empty")

			var rej *envelope.RejectError
			require.ErrorAs(t, err, &rej)
			require.Equal(t, tt.reason, rej.Reason, "detail: %s", rej.Detail)
			require.NotEmpty(t, rej.Detail)
			require.Equal(t, rej.Reason+": "+rej.Detail, err.Error())
		})
	}

	t.Run("EveryDecodeReasonIsCovered", func(t *testing.T) {
		t.Parallel()

		seen := map[string]bool{}
		for _, tt := range rejected {
			seen[tt.reason] = true
		}
		for _, r := range allReasons {
			switch r {
			case envelope.ReasonConflict, envelope.ReasonUnknownRequest, envelope.ReasonDataError: // decided by admission, not by Decode
				continue
			case envelope.ReasonTooManyHeaders, envelope.ReasonHeadersTooLarge: // CheckHeaders, tested below
				continue
			}
			require.True(t, seen[r], "no test case rejects with %q", r)
		}
	})

	t.Run("RejectDetailIsBounded", func(t *testing.T) {
		t.Parallel()

		// Details travel in a Kafka header; a huge key or field name must
		// not make them huge.
		long := strings.Repeat("k", 10_000)
		_, err := envelope.Decode([]byte(long), []byte(ok), envelope.Limits{})
		require.Less(t, len(err.Error()), 300)
		_, err = envelope.Decode(nil, []byte(`{"`+long+`":1}`), envelope.Limits{})
		require.Less(t, len(err.Error()), 300)
	})
}

func TestPromptResumes(t *testing.T) {
	t.Parallel()

	require.True(t, envelope.Prompt{}.Resumes())
	require.True(t, envelope.Prompt{Resume: boolPtr(true)}.Resumes())
	require.False(t, envelope.Prompt{Resume: boolPtr(false)}.Resumes())
}

func TestPromptHash(t *testing.T) {
	t.Parallel()

	base := envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hello", Delivery: envelope.DeliveryQueue}

	t.Run("ExactRetryIsEqualWhateverResume", func(t *testing.T) {
		t.Parallel()

		for _, resume := range []*bool{nil, boolPtr(true), boolPtr(false)} {
			retry := base
			retry.Resume = resume
			require.Equal(t, base.Hash(), retry.Hash())
		}
	})

	t.Run("EqualForEqualDecodedRetries", func(t *testing.T) {
		t.Parallel()

		first, err := envelope.Decode(nil, []byte(`{"message_id":"m1","session_id":"s1","text":"hello","resume":false}`), envelope.Limits{})
		require.NoError(t, err)
		retry, err := envelope.Decode(nil, []byte(`{"resume":true,"text":"hello","session_id":"s1","delivery":"queue","message_id":"m1"}`), envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, first.Hash(), retry.Hash())
	})

	t.Run("MessageIDIsNotHashed", func(t *testing.T) {
		t.Parallel()

		// The hash compares payloads that share a message ID.
		other := base
		other.MessageID = "m2"
		require.Equal(t, base.Hash(), other.Hash())
	})

	t.Run("EmptyDeliveryMeansQueue", func(t *testing.T) {
		t.Parallel()

		other := base
		other.Delivery = ""
		require.Equal(t, base.Hash(), other.Hash())
	})

	t.Run("Differs", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name   string
			change func(*envelope.Prompt)
		}{
			{"Text", func(p *envelope.Prompt) { p.Text = "hello!" }},
			{"TextCase", func(p *envelope.Prompt) { p.Text = "Hello" }},
			{"Delivery", func(p *envelope.Prompt) { p.Delivery = envelope.DeliverySteer }},
			{"Session", func(p *envelope.Prompt) { p.SessionID = "s2" }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				other := base
				tt.change(&other)
				require.NotEqual(t, base.Hash(), other.Hash())
			})
		}
	})

	t.Run("NoCollisionWhenBytesMoveBetweenFields", func(t *testing.T) {
		t.Parallel()

		pairs := [][2]envelope.Prompt{
			{{SessionID: "ab", Text: "c"}, {SessionID: "a", Text: "bc"}},
			{{SessionID: "a", Text: "b;"}, {SessionID: "a;", Text: "b"}},
			{{SessionID: "s", Text: "1:x;"}, {SessionID: "s1:x;", Text: ""}},
			{{SessionID: "s", Text: "xqueue"}, {SessionID: "sx", Text: "queue"}},
			{{SessionID: "s", Text: "t", Delivery: envelope.DeliverySteer}, {SessionID: "s", Text: "t5:steer;"}},
		}
		for _, p := range pairs {
			require.NotEqual(t, p[0].Hash(), p[1].Hash(), "%+v vs %+v", p[0], p[1])
		}
	})

	t.Run("IsSHA256Sized", func(t *testing.T) {
		t.Parallel()

		require.Len(t, base.Hash(), 32)
	})
}

func TestMarshal(t *testing.T) {
	t.Parallel()

	t.Run("OmitsDefaults", func(t *testing.T) {
		t.Parallel()

		b, err := envelope.Marshal(envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hi"})
		require.NoError(t, err)
		require.JSONEq(t, `{"message_id":"m1","session_id":"s1","text":"hi"}`, string(b))
	})

	t.Run("KeepsResumeFalse", func(t *testing.T) {
		t.Parallel()

		in := envelope.Prompt{MessageID: "m1", SessionID: "s1", Text: "hi", Delivery: envelope.DeliverySteer, Resume: boolPtr(false)}
		b, err := envelope.Marshal(in)
		require.NoError(t, err)
		require.JSONEq(t, `{"message_id":"m1","session_id":"s1","text":"hi","delivery":"steer","resume":false}`, string(b))

		out, err := envelope.Decode([]byte("s1"), b, envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, in, out)
	})
}

func TestRejectErrorMatchesWithErrorsAs(t *testing.T) {
	t.Parallel()

	_, err := envelope.Decode(nil, []byte(`{}`), envelope.Limits{})
	wrapped := errors.Join(errors.New("admitting"), err)

	var rej *envelope.RejectError
	require.ErrorAs(t, wrapped, &rej)
	require.Equal(t, envelope.ReasonMissingField, rej.Reason)
}

func BenchmarkDecode(b *testing.B) {
	for _, size := range []int{100, 64 << 10, 1<<20 - 256} {
		value := []byte(`{"message_id":"018f6b2e-7c1a-7000-8000-000000000001","session_id":"sess-42","text":"` +
			strings.Repeat("é\\n", size/4) + `","delivery":"steer"}`)
		b.Run(strconv.Itoa(len(value)), func(b *testing.B) {
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				if _, err := envelope.Decode([]byte("sess-42"), value, envelope.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestLimitsBeyondDecode(t *testing.T) {
	t.Parallel()

	t.Run("BracketsInsideStringsDoNotNest", func(t *testing.T) {
		t.Parallel()
		text := strings.Repeat("[{", 100) + `\"]`
		p, err := envelope.Decode(nil, []byte(`{"message_id":"m1","session_id":"s1","text":"`+text+`"}`), envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, strings.Repeat("[{", 100)+`"]`, p.Text)
	})

	t.Run("Headers", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, envelope.CheckHeaders(32, 16<<10, envelope.Limits{}))
		var rej *envelope.RejectError
		require.ErrorAs(t, envelope.CheckHeaders(33, 0, envelope.Limits{}), &rej)
		require.Equal(t, envelope.ReasonTooManyHeaders, rej.Reason)
		require.ErrorAs(t, envelope.CheckHeaders(1, 16<<10+1, envelope.Limits{}), &rej)
		require.Equal(t, envelope.ReasonHeadersTooLarge, rej.Reason)
		require.ErrorAs(t, envelope.CheckHeaders(3, 0, envelope.Limits{MaxHeaders: 2}), &rej)
	})

	t.Run("Replies", func(t *testing.T) {
		t.Parallel()
		r, err := envelope.DecodeReply([]byte(`{"request_id":"r1","reply":"reject","message":"no"}`), envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, envelope.PermissionReply{RequestID: "r1", Reply: "reject", Message: "no"}, r)
		r, err = envelope.DecodeReply([]byte(`{"request_id":"r1","reply":"reject","message":"nope"}`), envelope.Limits{MaxTextBytes: 4})
		require.NoError(t, err, "a message exactly at the text limit")
		require.Equal(t, "nope", r.Message)
		_, err = envelope.DecodeReply([]byte(`{"request_id":"r1","reply":"reject","message":"nope!"}`), envelope.Limits{MaxTextBytes: 4})
		var tooLarge *envelope.RejectError
		require.ErrorAs(t, err, &tooLarge)
		require.Equal(t, envelope.ReasonTooLarge, tooLarge.Reason)
		for value, reason := range map[string]string{
			`{"request_id":1,"reply":"once"}`:                  envelope.ReasonInvalidField,
			`{"reply":"once"}`:                                 envelope.ReasonMissingField,
			`{"request_id":"r1"}`:                              envelope.ReasonMissingField,
			`{"request_id":"r1","reply":"maybe"}`:              envelope.ReasonInvalidField,
			`{"request_id":"r1","reply":"once","message":"x"}`: envelope.ReasonInvalidField,
			`{"request_id":"r1","reply":"once","extra":1}`:     envelope.ReasonUnknownField,
			`{"request_id":"r1","reply":"once","":1}`:          envelope.ReasonUnknownField,
			"\xff": envelope.ReasonInvalidUTF8,
			// The prompt decoder's discipline (issue 15, items 4 and 14):
			// encoding/json took these as approvals.
			`{"request_id":"r1","reply":"reject","message":"a\u0000b"}`:                                              envelope.ReasonInvalidField,
			`{"request_id":"r1","reply":"reject","message":"\u0000b"}`:                                               envelope.ReasonInvalidField,
			`{"Request_ID":"r1","REPLY":"once"}`:                                                                     envelope.ReasonUnknownField,
			`{"request_id":"r1","reply":"reject","Reply":"once"}`:                                                    envelope.ReasonUnknownField,
			`{"request_id":"r1","reply":"reject","reply":"once"}`:                                                    envelope.ReasonInvalidJSON,
			`{"request_id":"r1","request_id":"r2","reply":"once"}`:                                                   envelope.ReasonInvalidJSON,
			`{"request_id":"r1","reply":"once","message":null}`:                                                      envelope.ReasonInvalidField,
			`{"request_id":"r1","reply":null}`:                                                                       envelope.ReasonInvalidField,
			`{"request_id":"r1","reply":"reject","message":"\udc00"}`:                                                envelope.ReasonInvalidUTF8,
			`{"request_id":"r1","reply":"once"} {}`:                                                                  envelope.ReasonTrailingBytes,
			`{"request_id":"r1","reply":"once","message":` + strings.Repeat("[", 17) + strings.Repeat("]", 17) + `}`: envelope.ReasonTooDeep,
		} {
			_, err := envelope.DecodeReply([]byte(value), envelope.Limits{})
			var rej *envelope.RejectError
			require.ErrorAs(t, err, &rej, value)
			require.Equal(t, reason, rej.Reason, value)
		}
	})
}

// TestMarshalKeepsAnAdmissiblePromptAdmissible: Marshal writes a text as
// itself, without json.Marshal's HTML escapes (six bytes for each <, > or
// &): 400,000 '<' made a 2.4 MB envelope of a 400 kB prompt, which the
// client and `producer send` refused for its size, though admission takes
// it sent by any other producer.
func TestMarshalKeepsAnAdmissiblePromptAdmissible(t *testing.T) {
	t.Parallel()
	p := envelope.Prompt{MessageID: "m-1", SessionID: "s-1", Text: strings.Repeat("<&>", 130000), Delivery: envelope.DeliveryQueue}
	v, err := envelope.Marshal(p)
	require.NoError(t, err)
	require.Less(t, len(v), len(p.Text)+100, "the text is written as itself")
	got, err := envelope.Decode([]byte("s-1"), v, envelope.Limits{})
	require.NoError(t, err)
	require.Equal(t, p, got)

	// A reply's message too (the client's Reply and producer reply).
	r := envelope.PermissionReply{RequestID: "r-1", Reply: envelope.ReplyReject, Message: strings.Repeat("<&>", 130000)}
	v, err = envelope.MarshalReply(r)
	require.NoError(t, err)
	require.Less(t, len(v), len(r.Message)+100, "the message is written as itself")
	gotReply, err := envelope.DecodeReply(v, envelope.Limits{})
	require.NoError(t, err)
	require.Equal(t, r, gotReply)
}
