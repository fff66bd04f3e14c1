package ledger

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The writes of a turn's tool calls, each one call of a function of
// migration 00022 sent through group commit: the response that asks for
// the calls, a call's intent, a call's result (Execution.WriteCallRetried),
// and the next step's intent (Execution.WriteCall).
// Each builder gives its function's arguments after the fence's, in the
// function's order; events are the outbox rows' columns (outbox.Columns).

// Events are outbox rows as three columns, in order.
type Events struct {
	Topics   []string
	Keys     []string
	Payloads [][]byte
}

// StepCallsCall is the write of a step's response that asks for calls
// (promptline_step_calls; the fence sets the phase continue): the attempt
// succeeded with its usage and response ID, the message's text (part 0,
// unless empty) and callParts (its tool_call parts, from 1), the message
// completed, the calls as requested (their inputs as CallInput stores
// them), and events.
func StepCallsCall(attemptID string, inputTokens, outputTokens int64, responseID, messageID, text string,
	callParts []string, calls []CallParams, events Events) Call {
	n := len(calls)
	ids, idx, models, names, classes, inputs, keys := make([]string, n), make([]int32, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, c := range calls {
		ids[i], idx[i], models[i], names[i], classes[i], inputs[i], keys[i] = c.ID, int32(c.Index), c.ModelCallID, c.Tool, c.Class,
			string(CallInput(c.Input)), c.IdempotencyKey
	}
	return Call{Func: "promptline_step_calls", Args: []any{attemptID, inputTokens, outputTokens, responseID, messageID, text,
		callParts, ids, idx, models, names, classes, inputs, keys, events.Topics, events.Keys, events.Payloads}}
}

// StepBeginCall is a step's intent (promptline_step_begin; give the fence
// the phase unknown and p.AssistantMessageID): the step's pending
// assistant message answering answers in turn turnID, unless it exists,
// and p's attempt, new or deferred and begun again (a try more); any other
// reuse of p.ID is refused. p's execution and token are the fence's.
func StepBeginCall(answers []string, turnID string, p AttemptParams) Call {
	return Call{Func: "promptline_step_begin", Args: []any{answers, turnID, p.ID, int32(p.Step), p.Provider, p.IdempotencyKey,
		p.RequestHash, p.Model, p.RequestTokens}}
}

// CallStartCall is a call's intent (promptline_call_start; give the fence
// the phase unknown): the call started, which it must be requested to be,
// and events.
func CallStartCall(callID string, events Events) Call {
	return Call{Func: "promptline_call_start", Args: []any{callID, events.Topics, events.Keys, events.Payloads}}
}

// CallSettleCall is a call's result (promptline_call_settle): the call
// settled in state with output, the phase continue when no call of the
// attempt is started, the tool message answering modelCallID (an error
// when isError) with output as its text, and events. Its row is read by
// ScanCallCounts.
func CallSettleCall(callID, attemptID string, state CallState, output string, isError bool, modelCallID string, events Events) Call {
	return Call{Func: "promptline_call_settle", Args: []any{callID, attemptID, string(state), output, isError, modelCallID,
		events.Topics, events.Keys, events.Payloads}}
}

// ScanCallCounts reads CallSettleCall's answer: the attempt's calls still
// open, and of them the started ones.
func ScanCallCounts(row pgx.Row) (open, started int32, err error) {
	var counts []int32
	if err := row.Scan(&counts); err != nil {
		return 0, 0, err
	}
	if len(counts) != 2 {
		return 0, 0, fmt.Errorf("promptline_call_settle answered %d counts, not 2", len(counts))
	}
	return counts[0], counts[1], nil
}
