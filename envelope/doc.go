// Package envelope holds promptline's wire contracts: the prompt envelope
// that producers publish on the prompts topic, and the session events that
// promptline publishes on the session-events topic.
//
// Both are public contracts. Their JSON Schemas are embedded here
// (PromptSchema, EventSchema) and shipped in docs/ for producers and
// consumers written in other languages. Change them only with a note that
// says why.
//
// The prompt envelope, a JSON object, Kafka key = session ID:
//
//	{"message_id": "...", "session_id": "...", "text": "...",
//	 "delivery": "queue" | "steer", "resume": true}
//
// delivery defaults to "queue" and resume to true. Decode enforces the
// limits before and while decoding; every failure is a *RejectError whose
// Reason is one of the Reason* constants, the value of the reason header on
// the rejects topic.
package envelope
