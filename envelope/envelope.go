package envelope

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Delivery says how an admitted prompt joins its session.
type Delivery string

const (
	// DeliveryQueue runs the prompt as its own turn, after the turns queued
	// before it.
	DeliveryQueue Delivery = "queue"
	// DeliverySteer jumps the queue: waiting steers form the session's next
	// turn, ahead of queued prompts.
	DeliverySteer Delivery = "steer"
)

// Prompt is the envelope of one prompt on the prompts topic.
type Prompt struct {
	MessageID string   `json:"message_id"`
	SessionID string   `json:"session_id"`
	Text      string   `json:"text"`
	Delivery  Delivery `json:"delivery,omitempty"`
	// Resume arms a wake for the session. A nil Resume means true.
	Resume *bool `json:"resume,omitempty"`
}

// Resumes reports whether admitting p should wake its session.
func (p Prompt) Resumes() bool { return p.Resume == nil || *p.Resume }

// Hash is the payload hash that tells an exact retry from a conflicting
// reuse of a message ID. It covers what the prompt says (session, text,
// delivery) and deliberately not resume: a retry with resume=true of a
// prompt first sent with resume=false is the same prompt, asking now to be
// woken (docs/design.md, invariant 3).
func (p Prompt) Hash() []byte {
	// Length-prefixed fields: no two different prompts hash alike by
	// moving bytes between fields. One buffer, one sha256 pass: admission
	// hashes every prompt. The bytes are pinned by TestHashIsStable.
	delivery := string(cmp.Or(p.Delivery, DeliveryQueue))
	b := make([]byte, 0, len(p.SessionID)+len(p.Text)+len(delivery)+3*22)
	for _, s := range []string{p.SessionID, p.Text, delivery} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
		b = append(b, ';')
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// Reasons of rejection: the value of the reason header on the rejects topic.
const (
	ReasonTooLarge      = "too_large"
	ReasonInvalidJSON   = "invalid_json"
	ReasonMissingField  = "missing_field"
	ReasonInvalidField  = "invalid_field"
	ReasonUnknownField  = "unknown_field"
	ReasonKeyMismatch   = "key_mismatch"
	ReasonConflict      = "conflict"
	ReasonInvalidUTF8   = "invalid_utf8"
	ReasonTrailingBytes = "trailing_data"
	// ReasonUnknownRequest: a permission reply names no request.
	ReasonUnknownRequest = "unknown_request"
	// ReasonTooDeep: the JSON nests deeper than Limits.MaxDepth.
	ReasonTooDeep = "too_deep"
	// ReasonTooManyHeaders: more Kafka headers than Limits.MaxHeaders.
	ReasonTooManyHeaders = "too_many_headers"
	// ReasonHeadersTooLarge: the headers exceed Limits.MaxHeaderBytes.
	ReasonHeadersTooLarge = "headers_too_large"
	// ReasonDataError: Postgres refused a decoded message with a data error
	// that no retry fixes (SQLSTATE class 22 or 23); the detail names it.
	ReasonDataError = "data_error"
)

// RejectError says why a message is not a valid prompt.
type RejectError struct {
	Reason string // one of the Reason* constants
	Detail string // human-readable, names the field
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Limits bound what Decode accepts. Zero fields take the defaults.
type Limits struct {
	// MaxValueBytes is the largest accepted Kafka value. Defaults to 1 MiB.
	MaxValueBytes int
	// MaxIDLength is the longest message or session ID. Defaults to 128.
	MaxIDLength int
	// MaxTextBytes is the longest text. Defaults to MaxValueBytes.
	MaxTextBytes int
	// MaxDepth is the deepest JSON nesting accepted, checked before any
	// decoding (Go's decoder stops only at 10,000). Defaults to 16; a valid
	// envelope nests 1 deep.
	MaxDepth int
	// MaxHeaders is the most Kafka headers a message may carry. Defaults to 32.
	MaxHeaders int
	// MaxHeaderBytes bounds the headers' keys and values together.
	// Defaults to 16 KiB.
	MaxHeaderBytes int
}

// MaxValueBytesDefault is Limits.MaxValueBytes when it is zero.
const MaxValueBytesDefault = 1 << 20

const (
	maxIDLengthDefault    = 128
	maxDepthDefault       = 16
	maxHeadersDefault     = 32
	maxHeaderBytesDefault = 16 << 10
)

func (l Limits) withDefaults() Limits {
	l.MaxValueBytes = cmp.Or(l.MaxValueBytes, MaxValueBytesDefault)
	l.MaxIDLength = cmp.Or(l.MaxIDLength, maxIDLengthDefault)
	l.MaxTextBytes = cmp.Or(l.MaxTextBytes, l.MaxValueBytes)
	l.MaxDepth = cmp.Or(l.MaxDepth, maxDepthDefault)
	l.MaxHeaders = cmp.Or(l.MaxHeaders, maxHeadersDefault)
	l.MaxHeaderBytes = cmp.Or(l.MaxHeaderBytes, maxHeaderBytesDefault)
	return l
}

// CheckHeaders enforces the header limits on a message's headers (count,
// and the bytes of their keys and values), before its value is decoded.
// Every error is a *RejectError.
func CheckHeaders(count, bytes int, limits Limits) error {
	limits = limits.withDefaults()
	if count > limits.MaxHeaders {
		return reject(ReasonTooManyHeaders, "%d headers, limit %d", count, limits.MaxHeaders)
	}
	if bytes > limits.MaxHeaderBytes {
		return reject(ReasonHeadersTooLarge, "headers are %d bytes, limit %d", bytes, limits.MaxHeaderBytes)
	}
	return nil
}

// depth returns the deepest nesting of arrays and objects in value, outside
// strings, stopping as soon as it passes max: a linear scan that never
// allocates, so a hostile value costs no more than its length.
func depth(value []byte, max int) int {
	d, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range value {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			d++
			if d > deepest {
				deepest = d
				if deepest > max {
					return deepest
				}
			}
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}

// Decode parses and validates one prompt. key is the Kafka key (nil when
// absent); a present key must equal session_id. Every error is a
// *RejectError.
func Decode(key, value []byte, limits Limits) (Prompt, error) {
	limits = limits.withDefaults()
	fields, err := decodeObject(value, promptFields, limits)
	if err != nil {
		return Prompt{}, err
	}

	var p Prompt
	for _, f := range []struct {
		name string
		dst  *string
	}{{"message_id", &p.MessageID}, {"session_id", &p.SessionID}, {"text", &p.Text}} {
		raw, ok := fields[f.name]
		if !ok {
			return Prompt{}, reject(ReasonMissingField, "%s is required", f.name)
		}
		if err := decodeString(f.name, raw, f.dst); err != nil {
			return Prompt{}, err
		}
	}
	if err := validID("message_id", p.MessageID, limits.MaxIDLength); err != nil {
		return Prompt{}, err
	}
	if err := validID("session_id", p.SessionID, limits.MaxIDLength); err != nil {
		return Prompt{}, err
	}
	switch {
	case p.Text == "":
		return Prompt{}, reject(ReasonInvalidField, "text must not be empty")
	case len(p.Text) > limits.MaxTextBytes:
		return Prompt{}, reject(ReasonTooLarge, "text is %d bytes, limit %d", len(p.Text), limits.MaxTextBytes)
	case strings.IndexByte(p.Text, 0) >= 0:
		// Postgres text cannot hold U+0000: admitting it would fail the
		// admission transaction of its whole batch, and admission retries
		// until it commits, so one prompt would stop its partition (P6).
		return Prompt{}, reject(ReasonInvalidField, "text must not contain U+0000")
	}
	p.Delivery = DeliveryQueue
	if raw, ok := fields["delivery"]; ok {
		var d string
		if err := decodeString("delivery", raw, &d); err != nil {
			return Prompt{}, err
		}
		switch Delivery(d) {
		case DeliveryQueue, DeliverySteer:
			p.Delivery = Delivery(d)
		default:
			return Prompt{}, reject(ReasonInvalidField, "delivery %q: want \"queue\" or \"steer\"", truncate([]byte(d), 64))
		}
	}
	if raw, ok := fields["resume"]; ok {
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil || string(raw) == "null" {
			return Prompt{}, reject(ReasonInvalidField, "resume: want true or false")
		}
		p.Resume = &b
	}
	if key != nil && string(key) != p.SessionID {
		return Prompt{}, reject(ReasonKeyMismatch, "Kafka key %q differs from session_id %q", truncate(key, 64), p.SessionID)
	}
	return p, nil
}

// promptFields are the members of a prompt envelope, spelled exactly.
var promptFields = map[string]bool{"message_id": true, "session_id": true, "text": true, "delivery": true, "resume": true}

// decodeObject is the discipline every decoder of outside input shares
// (prompts, permission replies): the size limit, valid UTF-8, the depth
// limit before any decoding, then exactly one JSON object whose member
// names are among allowed, spelled exactly, none repeated. limits has its
// defaults already.
func decodeObject(value []byte, allowed map[string]bool, limits Limits) (map[string]json.RawMessage, error) {
	if len(value) > limits.MaxValueBytes {
		return nil, reject(ReasonTooLarge, "value is %d bytes, limit %d", len(value), limits.MaxValueBytes)
	}
	if !utf8.Valid(value) {
		return nil, reject(ReasonInvalidUTF8, "value is not valid UTF-8")
	}
	if d := depth(value, limits.MaxDepth); d > limits.MaxDepth {
		return nil, reject(ReasonTooDeep, "JSON nests deeper than %d", limits.MaxDepth)
	}
	return decodeMembers(value, allowed)
}

// decodeMembers splits value, which must be exactly one JSON object, into
// the raw values of its members. It does not unmarshal into a struct
// because encoding/json matches member names without regard to case and
// keeps the last of repeated names: {"message_id":"a","Message_ID":"b"}
// would be message "b" to encoding/json, message "a" (or a rejection) to a
// consumer in another language, and invalid to the JSON Schema. Here names
// match exactly and a repeated name is rejected.
func decodeMembers(value []byte, allowed map[string]bool) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return nil, reject(ReasonInvalidJSON, "value is empty")
	case err != nil:
		return nil, reject(ReasonInvalidJSON, "%v", err)
	case tok != json.Delim('{'):
		return nil, reject(ReasonInvalidJSON, "value is not a JSON object")
	}
	fields := make(map[string]json.RawMessage, len(allowed))
	// unknown is a pointer, not the name: "" is a member name too, and
	// the first unknown member must be reported whatever it is called.
	var unknown *string
	var repeated string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, reject(ReasonInvalidJSON, "%v", err)
		}
		name, _ := tok.(string) // in name position the decoder yields only strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, reject(ReasonInvalidJSON, "%v", err)
		}
		switch _, seen := fields[name]; {
		case !allowed[name]:
			if unknown == nil {
				unknown = &name
			}
		case seen:
			repeated = cmp.Or(repeated, name)
		default:
			fields[name] = raw
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, reject(ReasonInvalidJSON, "%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, reject(ReasonTrailingBytes, "data after the JSON object")
	}
	switch {
	case unknown != nil:
		return nil, reject(ReasonUnknownField, "unknown field %q", truncate([]byte(*unknown), 64))
	case repeated != "":
		return nil, reject(ReasonInvalidJSON, "field %q appears more than once", repeated)
	}
	return fields, nil
}

// decodeString unmarshals the raw JSON string of field into dst. null is a
// wrong type, not an absent field.
func decodeString(field string, raw json.RawMessage, dst *string) error {
	if len(raw) == 0 || raw[0] != '"' {
		return reject(ReasonInvalidField, "%s: want a string", field)
	}
	if loneSurrogate(raw) {
		// encoding/json would decode it as U+FFFD, so "\ud800" and
		// "\udbff" would be the same text and the same payload hash.
		return reject(ReasonInvalidUTF8, "%s escapes an unpaired UTF-16 surrogate", field)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return reject(ReasonInvalidField, "%s: %v", field, err)
	}
	return nil
}

// loneSurrogate reports whether the JSON string literal s has a \u escape
// of one half of a UTF-16 surrogate pair without the other half.
func loneSurrogate(s []byte) bool {
	hex4 := func(i int) (rune, bool) { // the escape \uXXXX starting at s[i]
		if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(s[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // skip the escaped character, which may be a backslash
			continue
		}
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if lo, ok := hex4(i + 6); ok && lo >= 0xdc00 && lo < 0xe000 {
				i += 11
				continue
			}
			return true
		case r >= 0xdc00 && r < 0xe000:
			return true
		}
		i += 5
	}
	return false
}

// ValidSessionID checks a session ID by the rules a prompt's session_id
// meets (a *RejectError): a client that sends a record keyed by a session,
// or filters by one, checks it with this before anything is sent.
func ValidSessionID(id string, limits Limits) error {
	return validID("session_id", id, limits.withDefaults().MaxIDLength)
}

// validID accepts 1..max printable ASCII characters: IDs travel in Kafka
// keys, headers, logs and URLs, where anything else is trouble.
func validID(field, id string, max int) error {
	if id == "" || len(id) > max {
		return reject(ReasonInvalidField, "%s must be 1 to %d characters, got %d", field, max, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return reject(ReasonInvalidField, "%s has a non-printable or non-ASCII character at byte %d", field, i)
		}
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// Marshal encodes p as producers should publish it: without the HTML
// escapes of json.Marshal, which write <, > and & as six bytes each, so
// that a text of markup would take up to six times its size on the wire,
// and a prompt admission takes could be refused for its size by its own
// producer (marshalEvent does the same for events). U+2028 and U+2029 are
// still escaped (encoding/json always does): six bytes for three.
func Marshal(p Prompt) ([]byte, error) { return marshalUnescaped(p) }

// MarshalReply encodes r as producers should publish it, as Marshal does
// a prompt: a reply's message is the model's to read, markup included.
func MarshalReply(r PermissionReply) ([]byte, error) { return marshalUnescaped(r) }

func marshalUnescaped(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
