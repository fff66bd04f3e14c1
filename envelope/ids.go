package envelope

import (
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// ToolCallID is the ID of a provider step's index-th tool call: the
// step's attempt ID (ledger.AttemptID: <execution ID>/step-<n>) and
// /call-<index>. It names the call in tool.started and tool.completed
// (call_id), and it is also the ID of the message the call's result is
// written as, once the tool returns.
func ToolCallID(attemptID string, index int) string {
	return attemptID + "/call-" + strconv.Itoa(index)
}

// IsToolCallID reports whether id has the form of a tool call's ID:
// <execution ID>/step-<digits>/call-<digits>, where an execution ID is a
// UUID in its canonical form (the executor's). That form is promptline's
// own: a prompt whose message_id takes it is a conflict at admission (P2),
// even when no such call exists yet, since the call's result will be
// written under that ID and the prompt's user message would collide with
// it. An ID that only ends so ("job-7/step-2/call-1", or
// "permission-reply-" and a call's ID, which a prompt may hold: docs/producers.md)
// names no call promptline can make.
func IsToolCallID(id string) bool {
	rest, ok := cutDigitsAfter(id, "/call-")
	if !ok {
		return false
	}
	execution, ok := cutDigitsAfter(rest, "/step-")
	if !ok || len(execution) != 36 {
		return false
	}
	_, err := uuid.Parse(execution)
	return err == nil
}

// cutDigitsAfter returns s without its end, when that end is sep and one
// or more ASCII digits.
func cutDigitsAfter(s, sep string) (string, bool) {
	end := len(s)
	for end > 0 && s[end-1] >= '0' && s[end-1] <= '9' {
		end--
	}
	if end == len(s) || !strings.HasSuffix(s[:end], sep) {
		return "", false
	}
	return s[:end-len(sep)], true
}
