package envelope

import _ "embed"

// The canonical schemas live beside this file because go:embed cannot
// reach ../docs; docs/ holds byte-identical copies for people and other
// languages, and a test keeps the two from drifting.

// PromptSchema is the JSON Schema (draft 2020-12) of the prompt envelope.
// Decode enforces more than it can say: see its description.
//
//go:embed prompt.schema.json
var PromptSchema []byte

// EventSchema is the JSON Schema (draft 2020-12) of a session event.
//
//go:embed session-event.schema.json
var EventSchema []byte

// DeltaSchema is the JSON Schema (draft 2020-12) of a live text delta on
// the session-deltas topic.
//
//go:embed session-delta.schema.json
var DeltaSchema []byte
