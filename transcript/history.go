package transcript

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/provider"
)

// ToolCallPart is the body of a tool_call part, as JSON: a tool call as
// the model requested it.
type ToolCallPart struct {
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// UnsettledResult stands in for the result of a tool call that has none: a
// provider must never receive a tool call without its result.
const UnsettledResult = "no result: the call was interrupted before it ran, or its outcome is unknown after a restart; it was not run again"

// History reads the session's transcript as a provider sees it, in the
// caller's transaction: user messages, completed assistant messages (text
// and tool calls) and tool results, oldest first; every tool call is
// followed by a result (SettleOrphans). A stored part that cannot be
// decoded fails it with an *UnreadablePartError (errors.As): no part of
// the transcript is left out or guessed at, for a request built without
// it could have the model repeat what it cannot see.
func History(ctx context.Context, tx pgx.Tx, sessionID string) ([]provider.TranscriptMessage, error) {
	rows, err := tx.Query(ctx, historySQL, sessionID)
	if err != nil {
		return nil, fmt.Errorf("reading transcript: %w", err)
	}
	out, err := scanHistory(rows)
	if err != nil {
		return nil, err
	}
	return SettleOrphans(out), nil
}

// QueueHistory queues History's read on a queued write (a pgx.Batch), and
// hands set the stored transcript when the batch's results are read. It is
// not settled: the caller appends what its transaction adds (the turn's
// user messages) and calls SettleOrphans. set may run twice (a combined
// transaction sent again alone), and must set, not append.
//
// A transcript that cannot be read is handed to set as unreadable (an
// *UnreadablePartError, with no messages), not returned to the batch: it
// is a fact about the session's rows, not a failure of the batch, whose
// other statements (a claim taken with the read) stand. A driver error
// fails the batch as before.
func QueueHistory(b *pgx.Batch, sessionID string, set func(h []provider.TranscriptMessage, unreadable error)) {
	b.Queue(historySQL, sessionID).Query(func(rows pgx.Rows) error {
		out, err := scanHistory(rows)
		var u *UnreadablePartError
		switch {
		case errors.As(err, &u):
			set(nil, err)
		case err != nil:
			return err
		default:
			set(out, nil)
		}
		return nil
	})
}

// CheckHistoryParams names a session.
type CheckHistoryParams struct {
	SessionID string
}

// CheckHistory says whether History can read the session's transcript: nil
// when it can, the *UnreadablePartError of the first part (in transcript
// order) it cannot decode, or the driver's error. It reads the tool-call
// parts alone, the only parts History decodes.
func CheckHistory(ctx context.Context, tx pgx.Tx, p *CheckHistoryParams) error {
	rows, err := tx.Query(ctx, toolCallPartsSQL, p.SessionID)
	if err != nil {
		return err
	}
	var (
		id   string
		idx  int
		body string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &idx, &body}, func() error {
		_, err := decodeToolCall(id, idx, body)
		return err
	})
	return err
}

// decodeToolCall decodes the body of a tool_call part: the one rule by
// which History reads one and CheckHistory judges it.
func decodeToolCall(messageID string, idx int, body string) (ToolCallPart, error) {
	var p ToolCallPart
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		return ToolCallPart{}, &UnreadablePartError{MessageID: messageID, Index: idx, Err: err}
	}
	return p, nil
}

// scanHistory reads historySQL's rows into messages, orphans unsettled.
func scanHistory(rows pgx.Rows) ([]provider.TranscriptMessage, error) {
	var out []provider.TranscriptMessage
	var (
		id, role   string
		toolCallID *string
		isError    bool
		idx        *int
		kind, body *string
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &role, &toolCallID, &isError, &idx, &kind, &body}, func() error {
		if len(out) == 0 || out[len(out)-1].ID != id {
			m := provider.TranscriptMessage{ID: id, Role: role, IsError: isError}
			if toolCallID != nil {
				m.ToolCallID = *toolCallID
			}
			out = append(out, m)
		}
		m := &out[len(out)-1]
		switch {
		case kind == nil:
		case *kind == PartText:
			m.Text += *body
		case *kind == PartToolCall:
			p, err := decodeToolCall(id, *idx, *body)
			if err != nil {
				return err
			}
			m.ToolCalls = append(m.ToolCalls, provider.ToolCall(p))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading transcript: %w", err)
	}
	return out, nil
}

// SettleOrphans places a synthetic error result after every tool call that
// has none, and drops results that answer no call before them. A result
// answers the latest call with its ID that is still open: a model may use
// one call ID again in a later step (providers require IDs unique within
// one answer only), and the earlier call's result must not pass for the
// later one's, or the provider would get a call without its result and
// refuse every later step of the session.
func SettleOrphans(in []provider.TranscriptMessage) []provider.TranscriptMessage {
	type callAt struct {
		at int // the assistant message's index in in
		id string
	}
	open := map[string][]int{}
	answered := map[callAt]int{}
	keep := make([]bool, len(in))
	for i, m := range in {
		keep[i] = true
		if m.Role == "tool" {
			calls := open[m.ToolCallID]
			if len(calls) == 0 {
				keep[i] = false
				continue
			}
			at := calls[len(calls)-1]
			open[m.ToolCallID] = calls[:len(calls)-1]
			answered[callAt{at, m.ToolCallID}]++
			continue
		}
		for _, c := range m.ToolCalls {
			open[c.ID] = append(open[c.ID], i)
		}
	}
	out := make([]provider.TranscriptMessage, 0, len(in))
	for i := 0; i < len(in); i++ {
		m := in[i]
		if !keep[i] {
			continue
		}
		out = append(out, m)
		if len(m.ToolCalls) == 0 {
			continue
		}
		at := i
		// Keep the results that follow, then add the missing ones.
		for i+1 < len(in) && in[i+1].Role == "tool" {
			i++
			if keep[i] {
				out = append(out, in[i])
			}
		}
		seen := map[string]int{}
		for _, c := range m.ToolCalls {
			seen[c.ID]++
			if seen[c.ID] > answered[callAt{at, c.ID}] {
				out = append(out, provider.TranscriptMessage{ID: c.ID + "/unsettled", Role: "tool", ToolCallID: c.ID, IsError: true, Text: UnsettledResult})
			}
		}
	}
	return out
}

// The provider sees user messages, tool results and completed assistant
// messages; pending and errored assistant messages are not part of it.
const visibleSQL = `m.session_id = $1 AND (m.role IN ('user', 'tool') OR m.status = 'completed')`

// partsOf is message m's parts, looked up by its key: a lateral subquery
// that OFFSET 0 keeps from being flattened into a join, which statistics
// taken while the tables grew (or skewed by one long session) had planned
// as a hash of the whole of message_parts at each read
// (TestPartsAreLookedUpByMessageUnderSkewedStatistics). Statistics that
// put a fifth of the table on one message still plan the lookup; ones
// that put half of it there would plan a scan per message (only a read
// planned with sequential scans off would hold then). toolCallPartsOf is
// its tool calls only.
const (
	partsOf         = `(SELECT p.idx, p.kind, p.body FROM message_parts p WHERE p.message_id = m.message_id OFFSET 0) p`
	toolCallPartsOf = `(SELECT p.idx, p.kind, p.body FROM message_parts p
		WHERE p.message_id = m.message_id AND p.kind = 'tool_call' OFFSET 0) p`
)

const historySQL = `
SELECT m.message_id, m.role, m.tool_call_id, m.is_error, p.idx, p.kind, p.body
FROM messages m LEFT JOIN LATERAL ` + partsOf + ` ON true
WHERE ` + visibleSQL + `
ORDER BY m.seq, p.idx`

const toolCallPartsSQL = `
SELECT m.message_id, p.idx, p.body
FROM messages m JOIN LATERAL ` + toolCallPartsOf + ` ON true
WHERE ` + visibleSQL + `
ORDER BY m.seq, p.idx`
