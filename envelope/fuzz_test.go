package envelope_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/promptline/promptline/envelope"
)

// FuzzDecode checks Decode on arbitrary input: it never panics; what it
// accepts is a valid prompt that survives Marshal and Decode unchanged,
// hash included; what it refuses is a *RejectError with a known reason.
// Seeds: the f.Add calls below and testdata/fuzz/FuzzDecode (crashers found
// by `go test -fuzz FuzzDecode` belong there).
func FuzzDecode(f *testing.F) {
	for _, s := range []struct {
		value      string
		key        string
		keyPresent bool
	}{
		{`{"message_id":"m1","session_id":"s1","text":"hello"}`, "s1", true},
		{`{"message_id":"m1","session_id":"s1","text":"hello"}`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"hello"}`, "", true},
		{`{"message_id":"m1","session_id":"s1","text":"hello"}`, "s2", true},
		{`{"message_id":"m1","session_id":"s1","text":"stop","delivery":"steer","resume":false}`, "s1", true},
		{`{"resume":true,"delivery":"queue","text":"x","session_id":"s","message_id":"m"}`, "s", true},
		{`{"message_id":"m1","session_id":"s1","text":"h\u00e9 \ud83d\ude00 <&> \u2028 \"\\"}`, "s1", true},
		{`{"message_id":"m1","session_id":"s1","text":"\ud800"}`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"a\u0000"}`, "", false},
		{`{"message_id":"m1","message_id":"m2","session_id":"s1","text":"x"}`, "", false},
		{`{"Message_ID":"m1","session_id":"s1","text":"x"}`, "", false},
		{`{"message\u005fid":"m1","session_id":"s1","text":"x"}`, "", false},
		{`{"message_id":null,"session_id":"s1","text":"x","resume":null,"delivery":null}`, "", false},
		{`{"message_id":1,"session_id":["s"],"text":{},"resume":"true"}`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"x"} {}`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"x"}]`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":""}`, "", false},
		{`{"message_id":"m 1","session_id":"s1","text":"x","extra":1}`, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"x","":1}`, "", false},
		{"{\"message_id\":\"m1\",\"session_id\":\"s1\",\"text\":\"\xff\"}", "", false},
		{`{}`, "", false},
		{`[]`, "", false},
		{`null`, "", false},
		{``, "", false},
		{`{"message_id":"m1","session_id":"s1","text":"x",}`, "", false},
	} {
		f.Add([]byte(s.value), s.key, s.keyPresent)
	}

	f.Fuzz(func(t *testing.T, value []byte, key string, keyPresent bool) {
		var k []byte
		if keyPresent {
			k = []byte(key)
		}
		p, err := envelope.Decode(k, value, envelope.Limits{})
		if err != nil {
			var rej *envelope.RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("error %v (%T) is not a *RejectError", err, err)
			}
			if rej.Reason == "" || !slices.Contains(allReasons, rej.Reason) {
				t.Fatalf("unknown reason %q (detail %q)", rej.Reason, rej.Detail)
			}
			if rej.Reason == envelope.ReasonConflict || rej.Reason == envelope.ReasonDataError {
				t.Fatalf("Decode cannot know of %s: %v", rej.Reason, err)
			}
			if rej.Detail == "" {
				t.Fatalf("reason %q without detail", rej.Reason)
			}
			if p != (envelope.Prompt{}) {
				t.Fatalf("rejected, yet returned %+v", p)
			}
			return
		}

		checkValid(t, k, p)
		checkMembers(t, value)

		b, err := envelope.Marshal(p)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", p, err)
		}
		// Marshal escapes <, >, & and control characters, so it can make a
		// value longer than the one decoded; the size limit is not what is
		// under test here.
		again, err := envelope.Decode(k, b, envelope.Limits{MaxValueBytes: len(b)})
		if err != nil {
			t.Fatalf("Decode(Marshal(%+v)) = %s: %v", p, b, err)
		}
		if !promptsEqual(p, again) {
			t.Fatalf("round trip changed the prompt:\n  %+v\n  %+v\n  via %s", p, again, b)
		}
		if !bytes.Equal(p.Hash(), again.Hash()) {
			t.Fatalf("round trip changed the hash of %+v", p)
		}
	})
}

// checkValid asserts what Decode promises of an accepted prompt.
func checkValid(t *testing.T, key []byte, p envelope.Prompt) {
	t.Helper()
	for _, id := range []string{p.MessageID, p.SessionID} {
		if id == "" || len(id) > 128 {
			t.Fatalf("accepted ID %q of length %d", id, len(id))
		}
		for i := 0; i < len(id); i++ {
			if id[i] < 0x21 || id[i] > 0x7e {
				t.Fatalf("accepted ID %q with byte %#x", id, id[i])
			}
		}
	}
	if p.Text == "" || !utf8.ValidString(p.Text) || bytes.IndexByte([]byte(p.Text), 0) >= 0 {
		t.Fatalf("accepted text %q", p.Text)
	}
	if p.Delivery != envelope.DeliveryQueue && p.Delivery != envelope.DeliverySteer {
		t.Fatalf("accepted delivery %q", p.Delivery)
	}
	if key != nil && string(key) != p.SessionID {
		t.Fatalf("accepted key %q for session %q", key, p.SessionID)
	}
}

// checkMembers asserts that an accepted value is one object whose member
// names are the envelope's, spelled exactly, each once (the schema's
// additionalProperties: false, and no unknown member of any name).
func checkMembers(t *testing.T, value []byte) {
	t.Helper()
	allowed := map[string]bool{"message_id": true, "session_id": true, "text": true, "delivery": true, "resume": true}
	dec := json.NewDecoder(bytes.NewReader(value))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("accepted %q, which does not open an object", value)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("accepted %q: %v", value, err)
		}
		name, _ := tok.(string)
		if !allowed[name] || seen[name] {
			t.Fatalf("accepted %q with member %q", value, name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("accepted %q: %v", value, err)
		}
	}
}

func promptsEqual(a, b envelope.Prompt) bool {
	if a.MessageID != b.MessageID || a.SessionID != b.SessionID || a.Text != b.Text || a.Delivery != b.Delivery {
		return false
	}
	if (a.Resume == nil) != (b.Resume == nil) {
		return false
	}
	return a.Resume == nil || *a.Resume == *b.Resume
}

// FuzzDecodeReply checks DecodeReply on arbitrary input: it never panics;
// what it accepts is a valid reply (member names exact and unrepeated, no
// U+0000, a known reply, a message only with reject) that survives
// json.Marshal and DecodeReply unchanged; what it refuses is a
// *RejectError with a known reason. Seeds: the f.Add calls below and
// testdata/fuzz/FuzzDecodeReply.
func FuzzDecodeReply(f *testing.F) {
	for _, s := range []string{
		`{"request_id":"r1","reply":"once"}`,
		`{"request_id":"r1","reply":"always"}`,
		`{"request_id":"r1","reply":"reject","message":"use something else"}`,
		`{"reply":"reject","message":"h\u00e9 \ud83d\ude00 <&>","request_id":"r1"}`,
		`{"request_id":"r1","reply":"reject","message":"a\u0000b"}`,
		`{"Request_ID":"r1","REPLY":"once"}`,
		`{"request_id":"r1","reply":"reject","Reply":"once"}`,
		`{"request_id":"r1","reply":"reject","reply":"once"}`,
		`{"request_id":"r1","reply":"once","message":"x"}`,
		`{"request_id":"r1","reply":"once","message":null}`,
		`{"request_id":"r\u0031","reply":"once"}`,
		`{"request_id":"r1","reply":"reject","message":"\ud800"}`,
		`{"request_id":"r1","reply":"once","extra":[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]}`,
		`{"request_id":"r1","reply":"once"} {}`,
		`{"request_id":1,"reply":"once"}`,
		"{\"request_id\":\"r1\",\"reply\":\"reject\",\"message\":\"\xff\"}",
		`{}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, value []byte) {
		r, err := envelope.DecodeReply(value, envelope.Limits{})
		if err != nil {
			var rej *envelope.RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("error %v (%T) is not a *RejectError", err, err)
			}
			if !slices.Contains(allReasons, rej.Reason) || rej.Reason == envelope.ReasonConflict || rej.Reason == envelope.ReasonUnknownRequest || rej.Reason == envelope.ReasonDataError {
				t.Fatalf("reason %q (detail %q) is not one DecodeReply may give", rej.Reason, rej.Detail)
			}
			if rej.Detail == "" {
				t.Fatalf("reason %q without detail", rej.Reason)
			}
			if r != (envelope.PermissionReply{}) {
				t.Fatalf("rejected, yet returned %+v", r)
			}
			return
		}
		if r.RequestID == "" || len(r.RequestID) > 4*128 {
			t.Fatalf("accepted request ID %q", r.RequestID)
		}
		for i := 0; i < len(r.RequestID); i++ {
			if r.RequestID[i] < 0x21 || r.RequestID[i] > 0x7e {
				t.Fatalf("accepted request ID %q with byte %#x", r.RequestID, r.RequestID[i])
			}
		}
		if !slices.Contains([]string{envelope.ReplyOnce, envelope.ReplyAlways, envelope.ReplyReject}, r.Reply) {
			t.Fatalf("accepted reply %q", r.Reply)
		}
		if !utf8.ValidString(r.Message) || bytes.IndexByte([]byte(r.Message), 0) >= 0 || (r.Message != "" && r.Reply != envelope.ReplyReject) {
			t.Fatalf("accepted message %q with reply %q", r.Message, r.Reply)
		}
		// Exactly the accepted member names: a decoder in another language
		// reading the same bytes sees the same reply.
		var members map[string]json.RawMessage
		if err := json.Unmarshal(value, &members); err != nil {
			t.Fatalf("accepted %q, which is no JSON object: %v", value, err)
		}
		for name := range members {
			if name != "request_id" && name != "reply" && name != "message" {
				t.Fatalf("accepted member %q", name)
			}
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", r, err)
		}
		again, err := envelope.DecodeReply(b, envelope.Limits{MaxValueBytes: len(b)})
		if err != nil || again != r {
			t.Fatalf("round trip of %+v via %s: %+v, %v", r, b, again, err)
		}
	})
}
