package envelope_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

func TestSchemaDocsCopiesMatch(t *testing.T) {
	t.Parallel()

	// docs/ holds copies for producers and consumers in other languages;
	// the embedded files are canonical. Fix a failure with
	//   cp envelope/*.schema.json docs/
	for _, tt := range []struct {
		doc      string
		embedded []byte
	}{
		{"../docs/prompt.schema.json", envelope.PromptSchema},
		{"../docs/session-event.schema.json", envelope.EventSchema},
		{"../docs/session-delta.schema.json", envelope.DeltaSchema},
	} {
		b, err := os.ReadFile(tt.doc)
		require.NoError(t, err)
		require.True(t, bytes.Equal(tt.embedded, b), "%s differs from the embedded schema", tt.doc)
	}
}

// TestEventTypesAreTheSchemas: EventTypes (what producer watch --type
// accepts) is the schema's list of event types, one branch each.
func TestEventTypesAreTheSchemas(t *testing.T) {
	t.Parallel()
	var doc struct {
		OneOf []struct {
			Properties struct {
				Type struct {
					Const string `json:"const"`
				} `json:"type"`
			} `json:"properties"`
		} `json:"oneOf"`
	}
	require.NoError(t, json.Unmarshal(envelope.EventSchema, &doc))
	var inSchema []string
	for _, b := range doc.OneOf {
		inSchema = append(inSchema, b.Properties.Type.Const)
	}
	require.ElementsMatch(t, inSchema, envelope.EventTypes)
}

type schemaBundle struct {
	prompt *jsonschema.Schema
	event  *jsonschema.Schema
}

func setupSchemas(t *testing.T) *schemaBundle {
	t.Helper()
	return &schemaBundle{
		prompt: compileSchema(t, envelope.PromptSchema),
		event:  compileSchema(t, envelope.EventSchema),
	}
}

// compileSchema compiles schema, which also checks it against the draft
// 2020-12 metaschema. Formats (date-time) are asserted, as a strict
// consumer would.
func compileSchema(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	require.NoError(t, err)
	id, _ := doc.(map[string]any)["$id"].(string)
	require.NotEmpty(t, id, "schema has no $id")
	require.Equal(t, "https://json-schema.org/draft/2020-12/schema", doc.(map[string]any)["$schema"])

	c := jsonschema.NewCompiler()
	c.AssertFormat()
	require.NoError(t, c.AddResource(id, doc))
	sch, err := c.Compile(id)
	require.NoError(t, err)
	return sch
}

// schemaAccepts reports whether value parses as one JSON document and
// validates against sch.
func schemaAccepts(sch *jsonschema.Schema, value []byte) (bool, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return false, err
	}
	if err := sch.Validate(doc); err != nil {
		return false, err
	}
	return true, nil
}

func TestPromptSchemaAgreesWithDecode(t *testing.T) {
	t.Parallel()

	bundle := setupSchemas(t)
	id128 := strings.Repeat("x", 128)
	const ok = `{"message_id":"m1","session_id":"s1","text":"hello"}`

	for _, tt := range []struct {
		name   string
		key    []byte
		value  string
		limits envelope.Limits
		reason string // "" when Decode accepts
		// schemaValid differs from reason == "" only for the rules a JSON
		// Schema cannot express, and each such row says which.
		schemaValid bool
	}{
		{name: "Defaults", value: ok, schemaValid: true},
		{name: "Steer", value: `{"message_id":"m1","session_id":"s1","text":"hi","delivery":"steer"}`, schemaValid: true},
		{name: "QueueResumeTrue", value: `{"message_id":"m1","session_id":"s1","text":"hi","delivery":"queue","resume":true}`, schemaValid: true},
		{name: "ResumeFalse", value: `{"message_id":"m1","session_id":"s1","text":"hi","resume":false}`, schemaValid: true},
		{name: "IDLength128", value: `{"message_id":"` + id128 + `","session_id":"~!","text":"hi"}`, schemaValid: true},
		{name: "UnicodeText", value: `{"message_id":"m1","session_id":"s1","text":"東京 \ud83d\ude00\n"}`, schemaValid: true},
		{name: "EscapedMemberName", value: `{"message\u005fid":"m1","session_id":"s1","text":"hi"}`, schemaValid: true},

		// Structural: both refuse.
		{name: "MissingMessageID", value: `{"session_id":"s1","text":"hi"}`, reason: envelope.ReasonMissingField},
		{name: "MissingSessionID", value: `{"message_id":"m1","text":"hi"}`, reason: envelope.ReasonMissingField},
		{name: "MissingText", value: `{"message_id":"m1","session_id":"s1"}`, reason: envelope.ReasonMissingField},
		{name: "MessageIDNumber", value: `{"message_id":7,"session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "TextArray", value: `{"message_id":"m1","session_id":"s1","text":["hi"]}`, reason: envelope.ReasonInvalidField},
		{name: "ResumeString", value: `{"message_id":"m1","session_id":"s1","text":"hi","resume":"false"}`, reason: envelope.ReasonInvalidField},
		{name: "DeliveryBool", value: `{"message_id":"m1","session_id":"s1","text":"hi","delivery":true}`, reason: envelope.ReasonInvalidField},
		{name: "NullMessageID", value: `{"message_id":null,"session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "NullText", value: `{"message_id":"m1","session_id":"s1","text":null}`, reason: envelope.ReasonInvalidField},
		{name: "NullDelivery", value: `{"message_id":"m1","session_id":"s1","text":"hi","delivery":null}`, reason: envelope.ReasonInvalidField},
		{name: "NullResume", value: `{"message_id":"m1","session_id":"s1","text":"hi","resume":null}`, reason: envelope.ReasonInvalidField},
		{name: "UnknownField", value: `{"message_id":"m1","session_id":"s1","text":"hi","model":"x"}`, reason: envelope.ReasonUnknownField},
		{name: "NameInOtherCase", value: `{"message_id":"m1","Session_ID":"s1","text":"hi"}`, reason: envelope.ReasonUnknownField},
		{name: "EmptyMemberName", value: `{"message_id":"m1","session_id":"s1","text":"hi","":"x"}`, reason: envelope.ReasonUnknownField},
		{name: "BadDelivery", value: `{"message_id":"m1","session_id":"s1","text":"hi","delivery":"now"}`, reason: envelope.ReasonInvalidField},
		{name: "EmptyText", value: `{"message_id":"m1","session_id":"s1","text":""}`, reason: envelope.ReasonInvalidField},
		{name: "NULInText", value: `{"message_id":"m1","session_id":"s1","text":"a\u0000"}`, reason: envelope.ReasonInvalidField},
		{name: "EmptyMessageID", value: `{"message_id":"","session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "MessageIDTooLong", value: `{"message_id":"` + id128 + `x","session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "SessionIDTooLong", value: `{"message_id":"m1","session_id":"` + id128 + `x","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "IDWithSpace", value: `{"message_id":"m 1","session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "IDNonASCII", value: `{"message_id":"m1","session_id":"sé","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "IDControl", value: `{"message_id":"m\u007f","session_id":"s1","text":"hi"}`, reason: envelope.ReasonInvalidField},
		{name: "NotAnObject", value: `["m1","s1","hi"]`, reason: envelope.ReasonInvalidJSON},
		{name: "Null", value: `null`, reason: envelope.ReasonInvalidJSON},
		{name: "SyntaxError", value: `{"message_id":"m1",}`, reason: envelope.ReasonInvalidJSON},
		{name: "TrailingData", value: ok + `{}`, reason: envelope.ReasonTrailingBytes},

		// What the schema cannot express. It sees a parsed document, not
		// the Kafka message: not the key, not the byte count, and not the
		// bytes themselves (parsers replace invalid UTF-8 and unpaired
		// surrogates with U+FFFD and keep one of two repeated names).
		{name: "KeyMismatch", key: []byte("s2"), value: ok, reason: envelope.ReasonKeyMismatch, schemaValid: true},
		{name: "TooLarge", value: ok, limits: envelope.Limits{MaxValueBytes: 16}, reason: envelope.ReasonTooLarge, schemaValid: true},
		{name: "InvalidUTF8", value: "{\"message_id\":\"m1\",\"session_id\":\"s1\",\"text\":\"\xff\"}", reason: envelope.ReasonInvalidUTF8, schemaValid: true},
		{name: "UnpairedSurrogate", value: `{"message_id":"m1","session_id":"s1","text":"\udfff"}`, reason: envelope.ReasonInvalidUTF8, schemaValid: true},
		{name: "RepeatedMember", value: `{"message_id":"m1","session_id":"s1","text":"hi","text":"bye"}`, reason: envelope.ReasonInvalidJSON, schemaValid: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			valid, verr := schemaAccepts(bundle.prompt, []byte(tt.value))
			require.Equal(t, tt.schemaValid, valid, "schema: %v", verr)

			_, err := envelope.Decode(tt.key, []byte(tt.value), tt.limits)
			if tt.reason == "" {
				require.NoError(t, err)
				return
			}
			var rej *envelope.RejectError
			require.ErrorAs(t, err, &rej)
			require.Equal(t, tt.reason, rej.Reason, "detail: %s", rej.Detail)
		})
	}
}

func TestPromptSchemaAcceptsMarshal(t *testing.T) {
	t.Parallel()

	bundle := setupSchemas(t)
	for _, p := range []envelope.Prompt{
		{MessageID: "m1", SessionID: "s1", Text: "hi"},
		{MessageID: "m1", SessionID: "s1", Text: "<hi> & \x01", Delivery: envelope.DeliverySteer, Resume: boolPtr(false)},
		{MessageID: "m1", SessionID: "s1", Text: "hi", Delivery: envelope.DeliveryQueue, Resume: boolPtr(true)},
	} {
		b, err := envelope.Marshal(p)
		require.NoError(t, err)
		valid, verr := schemaAccepts(bundle.prompt, b)
		require.True(t, valid, "%s: %v", b, verr)
	}
}

func TestEventSchema(t *testing.T) {
	t.Parallel()

	bundle := setupSchemas(t)
	at := time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

	t.Run("AcceptsEventsBuiltInGo", func(t *testing.T) {
		t.Parallel()

		for _, e := range []envelope.Event{
			{
				ID: "input.admitted:m1", Type: envelope.EventInputAdmitted, SessionID: "s1", At: at,
				MessageID: "m1",
			},
			{
				ID: "turn.completed:a1", Type: envelope.EventTurnCompleted, SessionID: "s1", At: at,
				MessageIDs: []string{"m1", "m2"}, AssistantMessageID: "a1", Text: "Done.",
			},
			{
				// An empty answer is omitted, not sent as "".
				ID: "turn.completed:a2", Type: envelope.EventTurnCompleted, SessionID: "s1", At: at,
				MessageIDs: []string{"m3"}, AssistantMessageID: "a2",
			},
			{
				ID: "turn.failed:a3", Type: envelope.EventTurnFailed, SessionID: "s1", At: at,
				MessageIDs: []string{"m4"}, AssistantMessageID: "a3",
				Reason: envelope.FailProviderError, Error: "provider: 503 Service Unavailable",
			},
			{
				ID: "turn.failed:a4", Type: envelope.EventTurnFailed, SessionID: "s1", At: at.In(time.FixedZone("CET", 3600)),
				MessageIDs: []string{"m5"}, AssistantMessageID: "a4", Reason: envelope.FailUnsupported, Error: "tool calls are not supported",
			},
			{
				ID: "turn.failed:a5", Type: envelope.EventTurnFailed, SessionID: "s1", At: at,
				MessageIDs: []string{"m6"}, AssistantMessageID: "a5", Reason: envelope.FailInterrupted, Error: "context canceled",
			},
			{
				ID: "turn.started:t1", Type: envelope.EventTurnStarted, SessionID: "s1", At: at,
				TurnID: "t1", MessageIDs: []string{"m7"},
			},
			{
				ID: "step.completed:t1", Type: envelope.EventStepCompleted, SessionID: "s1", At: at,
				TurnID: "t1", MessageIDs: []string{"m7"}, AssistantMessageID: "t1", Step: 1, Text: "Looking.",
				ToolCalls: []envelope.EventToolCall{{CallID: "x1/attempt-1/call-0", ModelCallID: "call_a", Tool: "echo", Class: "idempotent"}},
			},
			{
				ID: "step.completed:a6", Type: envelope.EventStepCompleted, SessionID: "s1", At: at,
				TurnID: "t1", MessageIDs: []string{"m7"}, AssistantMessageID: "a6", Step: 2,
			},
			{
				ID: "tool.started:x1/attempt-1/call-0@3", Type: envelope.EventToolStarted, SessionID: "s1", At: at,
				TurnID: "t1", CallID: "x1/attempt-1/call-0", ModelCallID: "call_a", Tool: "echo", Class: "idempotent",
			},
			{
				ID: "tool.completed:x1/attempt-1/call-0@3", Type: envelope.EventToolCompleted, SessionID: "s1", At: at,
				TurnID: "t1", CallID: "x1/attempt-1/call-0", ModelCallID: "call_a", Tool: "echo", Class: "idempotent", Outcome: "succeeded",
			},
			{
				ID: "turn.recovered:x1", Type: envelope.EventTurnRecovered, SessionID: "s1", At: at,
				TurnID: "t1", MessageIDs: []string{"m7"}, AssistantMessageID: "t1", ExecutionID: "x1",
				ContinuationMessageID: "recovery-continue-x1", Rule: "idempotent_tool_retry",
			},
		} {
			b, err := json.Marshal(e)
			require.NoError(t, err)
			valid, verr := schemaAccepts(bundle.event, b)
			require.True(t, valid, "%s: %v", b, verr)

			got, err := envelope.DecodeEvent(b)
			require.NoError(t, err)
			require.True(t, e.At.Equal(got.At))
			got.At = e.At
			require.Equal(t, e, got)
		}
	})

	t.Run("RejectsIncompleteEvents", func(t *testing.T) {
		t.Parallel()

		const at = `"at":"2026-03-14T15:09:26Z"`
		for _, doc := range []string{
			`{"id":"x","type":"input.admitted","session_id":"s1",` + at + `}`,
			`{"type":"input.admitted","session_id":"s1",` + at + `,"message_id":"m1"}`,
			`{"id":"x","type":"input.admitted",` + at + `,"message_id":"m1"}`,
			`{"id":"x","type":"input.admitted","session_id":"s1","message_id":"m1"}`,
			`{"id":"x","type":"input.admitted","session_id":"s1","at":"yesterday","message_id":"m1"}`,
			`{"id":"","type":"input.admitted","session_id":"s1",` + at + `,"message_id":"m1"}`,
			`{"id":"x","type":"turn.started","session_id":"s1",` + at + `,"message_id":"m1"}`,
			`{"id":"x","type":"turn.completed","session_id":"s1",` + at + `,"assistant_message_id":"a1","text":"t"}`,
			`{"id":"x","type":"turn.completed","session_id":"s1",` + at + `,"message_ids":[],"assistant_message_id":"a1"}`,
			`{"id":"x","type":"turn.completed","session_id":"s1",` + at + `,"message_ids":["m1"]}`,
			`{"id":"x","type":"turn.completed","session_id":"s1",` + at + `,"message_ids":["m1"],"assistant_message_id":"a1","text":7}`,
			`{"id":"x","type":"turn.failed","session_id":"s1",` + at + `,"message_ids":["m1"],"assistant_message_id":"a1","error":"e"}`,
			`{"id":"x","type":"turn.failed","session_id":"s1",` + at + `,"message_ids":["m1"],"assistant_message_id":"a1","reason":""}`,
			`{"id":"x","type":"turn.started","session_id":"s1",` + at + `,"turn_id":"t1"}`,
			`{"id":"x","type":"step.completed","session_id":"s1",` + at + `,"turn_id":"t1","message_ids":["m1"],"assistant_message_id":"a1"}`,
			`{"id":"x","type":"step.completed","session_id":"s1",` + at + `,"turn_id":"t1","message_ids":["m1"],"assistant_message_id":"a1","step":0}`,
			`{"id":"x","type":"step.completed","session_id":"s1",` + at + `,"turn_id":"t1","message_ids":["m1"],"assistant_message_id":"a1","step":1,"tool_calls":[{"call_id":"c","tool":"echo","class":"idempotent"}]}`,
			`{"id":"x","type":"tool.started","session_id":"s1",` + at + `,"call_id":"c","model_call_id":"m","tool":"echo"}`,
			`{"id":"x","type":"tool.completed","session_id":"s1",` + at + `,"call_id":"c","model_call_id":"m","tool":"echo","class":"idempotent"}`,
			`{"id":"x","type":"turn.recovered","session_id":"s1",` + at + `,"turn_id":"t1","message_ids":["m1"],"assistant_message_id":"a1","execution_id":"x1"}`,
		} {
			valid, _ := schemaAccepts(bundle.event, []byte(doc))
			require.False(t, valid, "schema accepted %s", doc)
		}
	})
}

// TestSchemaPropertiesMatchGo keeps the schemas and the Go types naming the
// same members.
func TestSchemaPropertiesMatchGo(t *testing.T) {
	t.Parallel()

	jsonNames := func(v any) []string {
		var names []string
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
		slices.Sort(names)
		return names
	}
	schemaNames := func(schema []byte) []string {
		var doc struct {
			Properties map[string]any `json:"properties"`
			OneOf      []struct {
				Properties map[string]any `json:"properties"`
			} `json:"oneOf"`
		}
		require.NoError(t, json.Unmarshal(schema, &doc))
		set := map[string]bool{}
		for name := range doc.Properties {
			set[name] = true
		}
		for _, branch := range doc.OneOf {
			for name := range branch.Properties {
				set[name] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}

	require.Equal(t, jsonNames(envelope.Prompt{}), schemaNames(envelope.PromptSchema))
	require.Equal(t, jsonNames(envelope.Event{}), schemaNames(envelope.EventSchema))
}
