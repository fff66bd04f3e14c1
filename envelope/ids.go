package envelope

import (
	"strconv"
	"strings"
)

// ToolCallID is the ID of a provider step's index-th tool call: the
// step's attempt ID (ledger.AttemptID: <execution ID>/step-<n>) and
// /call-<index>. It names the call in tool.started and tool.completed
// (call_id), and it is also the ID of the message the call's result is
// written as, once the tool returns.
func ToolCallID(attemptID string, index int) string {
	return attemptID + "/call-" + strconv.Itoa(index)
}

// IsToolCallID reports whether id has the form of a tool call's ID: it
// ends in /step-<digits>/call-<digits>. That form is promptline's own: a
// prompt whose message_id takes it is a conflict at admission (P2), even
// when no such call exists yet, since the call's result will be written
// under that ID and the prompt's user message would collide with it.
func IsToolCallID(id string) bool {
	rest, ok := cutDigitsAfter(id, "/call-")
	if !ok {
		return false
	}
	_, ok = cutDigitsAfter(rest, "/step-")
	return ok
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
