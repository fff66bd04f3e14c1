package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
)

// ErrNotFound says that the database holds no such session. Session wraps
// it as "session S not found".
var ErrNotFound = errors.New("not found")

// Bounds of the texts a report carries.
const (
	// MaxTextRunes bounds one transcript part (prompt, answer, tool result,
	// tool-call input) and an unpromoted input's text.
	MaxTextRunes = 2000
	// MaxOutputRunes bounds the excerpt of a tool call's output in the
	// ledger section (the full result is in the transcript, bounded too).
	MaxOutputRunes = 200
)

// Session states (Report.State), derived from the claim, the permission
// requests and the waiting inputs, in that order of precedence.
const (
	StateQuarantined  = "quarantined"   // the claim is quarantined: an operator must release it
	StateClaimExpired = "claim_expired" // the claim's lease ran out: recovery's to take over
	StateRunning      = "running"       // a live claim: an executor works on the session
	StateParked       = "parked"        // a permission request is pending: only its reply runs next
	StateWaiting      = "waiting"       // inputs wait without a claim: a wake is on its way, or the redrive finds them
	StateIdle         = "idle"          // nothing waits, nothing runs
)

// Report is what Postgres holds about one session. Its JSON is stable:
// snake_case keys, every key always present (null when unset), lists
// never null. Times are RFC 3339 in UTC. Every timestamptz column also
// admits '-infinity' and 'infinity' (a hand edit, a restore or a repair
// script): each time is read as a pgdb.Time, so that such a value fails
// no report, least of all the one of the session an operator has to look
// at, and each time key has a key beside it named with "_not_finite"
// (the claim's expires_at: expires_at_not_finite), "-infinity" or
// "infinity" when the column holds that, the time then the zero time, as
// recovery's evidence has expired_at_not_finite; null otherwise.
type Report struct {
	SessionID               string     `json:"session_id"`
	State                   string     `json:"state"`
	FencingToken            int64      `json:"fencing_token"`
	CreatedAt               pgdb.Time  `json:"created_at"`
	CreatedAtNotFinite      *string    `json:"created_at_not_finite"`
	LastAdmittedAt          pgdb.Time  `json:"last_admitted_at"`
	LastAdmittedAtNotFinite *string    `json:"last_admitted_at_not_finite"`
	RedrivenAt              *pgdb.Time `json:"redriven_at"`
	RedrivenAtNotFinite     *string    `json:"redriven_at_not_finite"`
	// ReadAt is the database's clock when the report was read; Claim.Expired
	// is judged by it.
	ReadAt time.Time `json:"read_at"`

	Inputs             []Input             `json:"inputs"`
	Transcript         []Message           `json:"transcript"`
	Claim              *Claim              `json:"claim"`
	Attempts           []Attempt           `json:"attempts"`
	ToolCalls          []ToolCall          `json:"tool_calls"`
	Recoveries         []Recovery          `json:"recoveries"`
	Resolutions        []Resolution        `json:"resolutions"`
	PermissionRequests []PermissionRequest `json:"permission_requests"`
	PermissionGrants   []PermissionGrant   `json:"permission_grants"`
}

// Input is one admitted prompt (or a permission reply's, or a recovery
// continuation's input).
type Input struct {
	MessageID           string     `json:"message_id"`
	Delivery            string     `json:"delivery"`
	AdmissionSeq        int64      `json:"admission_seq"`
	AdmittedAt          pgdb.Time  `json:"admitted_at"`
	AdmittedAtNotFinite *string    `json:"admitted_at_not_finite"`
	Promoted            bool       `json:"promoted"`
	PromotionSeq        *int64     `json:"promotion_seq"`
	PromotedAt          *pgdb.Time `json:"promoted_at"`
	PromotedAtNotFinite *string    `json:"promoted_at_not_finite"`
	WakePending         bool       `json:"wake_pending"`
	// Waiting: the input is in the waiting_inputs view, i.e. promotable now.
	Waiting                bool       `json:"waiting"`
	QuarantineReason       *string    `json:"quarantine_reason"`
	QuarantinedAt          *pgdb.Time `json:"quarantined_at"`
	QuarantinedAtNotFinite *string    `json:"quarantined_at_not_finite"`
	SourceTopic            *string    `json:"source_topic"`
	SourcePartition        *int32     `json:"source_partition"`
	SourceOffset           *int64     `json:"source_offset"`
	// Text is the prompt, bounded; once promoted it is also the user
	// message's part in the transcript.
	Text Text `json:"text"`
}

// Text is a bounded text: Value holds at most the bound's runes; Truncated
// marks a cut, and Runes is the length before it.
type Text struct {
	Value     string `json:"value"`
	Truncated bool   `json:"truncated"`
	Runes     int    `json:"runes"`
}

func bound(s string, max int) Text {
	n := utf8.RuneCountInString(s)
	if n <= max {
		return Text{Value: s, Runes: n}
	}
	cut := 0
	for i := range s {
		if cut == max {
			s = s[:i]
			break
		}
		cut++
	}
	return Text{Value: s, Truncated: true, Runes: n}
}

// Message is one transcript message, in session order.
type Message struct {
	MessageID            string     `json:"message_id"`
	Role                 string     `json:"role"` // user, assistant or tool
	Seq                  int64      `json:"seq"`
	Status               string     `json:"status"` // pending, completed or errored
	Error                *string    `json:"error"`
	TurnID               *string    `json:"turn_id"`
	Answers              []string   `json:"answers"`      // assistant: the input IDs it answers
	ToolCallID           *string    `json:"tool_call_id"` // tool: the call it is the result of
	IsError              bool       `json:"is_error"`     // tool: the result is an error
	ExecutionID          *string    `json:"execution_id"`
	FencingToken         *int64     `json:"fencing_token"`
	CreatedAt            pgdb.Time  `json:"created_at"`
	CreatedAtNotFinite   *string    `json:"created_at_not_finite"`
	CompletedAt          *pgdb.Time `json:"completed_at"`
	CompletedAtNotFinite *string    `json:"completed_at_not_finite"`
	Parts                []Part     `json:"parts"`
}

// Part is one part of a message: a text, or a tool call.
type Part struct {
	Index    int       `json:"index"`
	Kind     string    `json:"kind"` // text or tool_call
	Text     *Text     `json:"text"`
	ToolCall *CallPart `json:"tool_call"`
	// Malformed says why a part could not be read as its kind; Text then
	// holds its raw body.
	Malformed *string `json:"malformed"`
}

// CallPart is a tool call the model requested.
type CallPart struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Input is the call's JSON input as text (bounded, so possibly cut).
	Input Text `json:"input"`
}

// Claim is the session's claim row.
type Claim struct {
	ExecutionID            string     `json:"execution_id"`
	OwnerID                string     `json:"owner_id"`
	FencingToken           int64      `json:"fencing_token"`
	Phase                  string     `json:"phase"`
	AssistantMessageID     *string    `json:"assistant_message_id"`
	AcquiredAt             pgdb.Time  `json:"acquired_at"`
	AcquiredAtNotFinite    *string    `json:"acquired_at_not_finite"`
	RenewedAt              pgdb.Time  `json:"renewed_at"`
	RenewedAtNotFinite     *string    `json:"renewed_at_not_finite"`
	ExpiresAt              pgdb.Time  `json:"expires_at"`
	ExpiresNotFinite       *string    `json:"expires_at_not_finite"`
	Expired                bool       `json:"expired"` // by the database clock, at ReadAt
	QuarantineReason       *string    `json:"quarantine_reason"`
	QuarantinedAt          *pgdb.Time `json:"quarantined_at"`
	QuarantinedAtNotFinite *string    `json:"quarantined_at_not_finite"`
}

// Attempt is one provider attempt of the ledger.
type Attempt struct {
	AttemptID          string  `json:"attempt_id"`
	ExecutionID        string  `json:"execution_id"`
	AssistantMessageID string  `json:"assistant_message_id"`
	Step               int     `json:"step"`
	Provider           string  `json:"provider"`
	State              string  `json:"state"`
	Tries              int     `json:"tries"`
	IdempotencyKey     string  `json:"idempotency_key"`
	FencingToken       int64   `json:"fencing_token"`
	Error              *string `json:"error"`
	InputTokens        *int64  `json:"input_tokens"`
	OutputTokens       *int64  `json:"output_tokens"`
	// Model, RequestTokens (the executor's estimate of the request's input
	// tokens) and ResponseID (the provider's response or request ID, from
	// the first bytes of its answer) are what is known of an attempt that
	// may have been billed; null when not recorded.
	Model                *string    `json:"model"`
	RequestTokens        *int64     `json:"request_tokens"`
	ResponseID           *string    `json:"response_id"`
	StartedAt            pgdb.Time  `json:"started_at"`
	StartedAtNotFinite   *string    `json:"started_at_not_finite"`
	NextRetryAt          *pgdb.Time `json:"next_retry_at"`
	NextRetryAtNotFinite *string    `json:"next_retry_at_not_finite"`
	FinishedAt           *pgdb.Time `json:"finished_at"`
	FinishedAtNotFinite  *string    `json:"finished_at_not_finite"`
}

// ToolCall is one tool invocation of the ledger.
type ToolCall struct {
	CallID         string `json:"call_id"`
	AttemptID      string `json:"attempt_id"`
	ExecutionID    string `json:"execution_id"`
	Index          int    `json:"index"`
	ModelCallID    string `json:"model_call_id"`
	Tool           string `json:"tool"`
	Class          string `json:"class"` // idempotent or side_effecting
	State          string `json:"state"`
	IdempotencyKey string `json:"idempotency_key"`
	FencingToken   int64  `json:"fencing_token"`
	IsError        *bool  `json:"is_error"`
	// Output is an excerpt of at most MaxOutputRunes; null before a result.
	Output               *Text      `json:"output"`
	RequestedAt          pgdb.Time  `json:"requested_at"`
	RequestedAtNotFinite *string    `json:"requested_at_not_finite"`
	StartedAt            *pgdb.Time `json:"started_at"`
	StartedAtNotFinite   *string    `json:"started_at_not_finite"`
	FinishedAt           *pgdb.Time `json:"finished_at"`
	FinishedAtNotFinite  *string    `json:"finished_at_not_finite"`
}

// Recovery is one recovery decision (`consumer recovery explain` gives its
// evidence in words).
type Recovery struct {
	ExecutionID           string     `json:"execution_id"`
	PhaseFound            string     `json:"phase_found"`
	Decision              string     `json:"decision"`
	Rule                  *string    `json:"rule"`
	ContinuationMessageID *string    `json:"continuation_message_id"`
	RetryAttemptID        *string    `json:"retry_attempt_id"`
	TokenBefore           int64      `json:"token_before"`
	TokenAfter            int64      `json:"token_after"`
	RecoveredBy           string     `json:"recovered_by"`
	DecidedAt             pgdb.Time  `json:"decided_at"`
	DecidedAtNotFinite    *string    `json:"decided_at_not_finite"`
	Settled               bool       `json:"settled"`
	SettledAt             *pgdb.Time `json:"settled_at"`
	SettledAtNotFinite    *string    `json:"settled_at_not_finite"`
	QuarantineReason      *string    `json:"quarantine_reason"`
}

// Resolution is an operator's finding on a tool call or provider attempt
// left unknown (`consumer session resolve`), and the continuation it
// admitted.
type Resolution struct {
	TargetID              string     `json:"target_id"`
	Round                 int        `json:"round"`
	TargetKind            string     `json:"target_kind"` // tool_call or attempt
	Finding               string     `json:"finding"`     // ran or did_not_run
	Output                *Text      `json:"output"`      // the result handed to the model (ran, on a tool call)
	StateBefore           string     `json:"state_before"`
	ContinuationMessageID *string    `json:"continuation_message_id"`
	ResolvedBy            string     `json:"resolved_by"`
	Note                  *string    `json:"note"`
	ResolvedAt            pgdb.Time  `json:"resolved_at"`
	ResolvedAtNotFinite   *string    `json:"resolved_at_not_finite"`
	Settled               bool       `json:"settled"`
	SettledAt             *pgdb.Time `json:"settled_at"`
	SettledAtNotFinite    *string    `json:"settled_at_not_finite"`
}

// PermissionRequest is one durable ask for tool approval and its reply.
type PermissionRequest struct {
	RequestID          string     `json:"request_id"`
	CallID             string     `json:"call_id"`
	Tool               string     `json:"tool"`
	Pattern            string     `json:"pattern"`
	Status             string     `json:"status"` // pending, approved or rejected
	Reply              *string    `json:"reply"`  // once, always or reject
	Message            *Text      `json:"message"`
	AskedAt            pgdb.Time  `json:"asked_at"`
	AskedAtNotFinite   *string    `json:"asked_at_not_finite"`
	RepliedAt          *pgdb.Time `json:"replied_at"`
	RepliedAtNotFinite *string    `json:"replied_at_not_finite"`
	ResumedAt          *pgdb.Time `json:"resumed_at"`
	ResumedAtNotFinite *string    `json:"resumed_at_not_finite"`
}

// PermissionGrant is an "always" reply, remembered for the session.
type PermissionGrant struct {
	Pattern            string    `json:"pattern"`
	RequestID          string    `json:"request_id"`
	GrantedAt          pgdb.Time `json:"granted_at"`
	GrantedAtNotFinite *string   `json:"granted_at_not_finite"`
}

// Session reads the report of one session; a session the database does not
// hold fails with ErrNotFound.
func Session(ctx context.Context, pool *pgxpool.Pool, sessionID string) (Report, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Report{}, fmt.Errorf("inspecting session %s: %w", sessionID, err)
	}
	// Read-only: nothing to commit; the rollback must run even when ctx
	// was cancelled, so that the connection goes back clean.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	r := Report{SessionID: sessionID}
	err = tx.QueryRow(ctx, sessionSQL, sessionID).Scan(&r.FencingToken, &r.CreatedAt, &r.LastAdmittedAt, &r.RedrivenAt, &r.ReadAt)
	if errors.Is(interpretError(err), ErrNotFound) {
		return Report{}, fmt.Errorf("session %s %w", sessionID, ErrNotFound)
	}
	if err != nil {
		return Report{}, fmt.Errorf("reading session %s: %w", sessionID, err)
	}
	for _, read := range []struct {
		what string
		fn   func(context.Context, pgx.Tx, *Report) error
	}{
		{"inputs", readInputs}, {"transcript", readTranscript}, {"claim", readClaim},
		{"attempts", readAttempts}, {"tool calls", readToolCalls}, {"recoveries", readRecoveries},
		{"resolutions", readResolutions},
		{"permission requests", readPermissions}, {"permission grants", readGrants},
	} {
		if err := read.fn(ctx, tx, &r); err != nil {
			return Report{}, fmt.Errorf("reading %s of session %s: %w", read.what, sessionID, err)
		}
	}
	r.State = state(r)
	utc(&r)
	return r, nil
}

func state(r Report) string {
	switch c := r.Claim; {
	case c != nil && c.QuarantineReason != nil:
		return StateQuarantined
	case c != nil && c.Expired:
		return StateClaimExpired
	case c != nil:
		return StateRunning
	}
	for _, p := range r.PermissionRequests {
		if p.Status == "pending" {
			return StateParked
		}
	}
	for _, in := range r.Inputs {
		if in.Waiting {
			return StateWaiting
		}
	}
	return StateIdle
}

func readInputs(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, inputsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var in Input
	var text string
	r.Inputs = []Input{}
	_, err = pgx.ForEachRow(rows, []any{&in.MessageID, &in.Delivery, &in.AdmissionSeq, &in.AdmittedAt, &in.PromotionSeq,
		&in.PromotedAt, &in.WakePending, &in.Waiting, &in.QuarantineReason, &in.QuarantinedAt,
		&in.SourceTopic, &in.SourcePartition, &in.SourceOffset, &text}, func() error {
		in.Promoted = in.PromotionSeq != nil
		in.Text = bound(text, MaxTextRunes)
		r.Inputs = append(r.Inputs, in)
		return nil
	})
	return err
}

func readTranscript(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, transcriptSQL, r.SessionID)
	if err != nil {
		return err
	}
	var m Message
	var idx *int
	var kind, body *string
	r.Transcript = []Message{}
	_, err = pgx.ForEachRow(rows, []any{&m.MessageID, &m.Role, &m.Seq, &m.Status, &m.Error, &m.TurnID, &m.Answers,
		&m.ToolCallID, &m.IsError, &m.ExecutionID, &m.FencingToken, &m.CreatedAt, &m.CompletedAt, &idx, &kind, &body}, func() error {
		if n := len(r.Transcript); n == 0 || r.Transcript[n-1].MessageID != m.MessageID {
			m.Parts = []Part{}
			if m.Answers == nil {
				m.Answers = []string{}
			}
			r.Transcript = append(r.Transcript, m)
		}
		if idx != nil {
			cur := &r.Transcript[len(r.Transcript)-1]
			cur.Parts = append(cur.Parts, part(*idx, *kind, *body))
		}
		m = Message{}
		return nil
	})
	return err
}

// part reads a message part; a tool-call part whose body is not the
// expected JSON is kept as text and marked malformed.
func part(idx int, kind, body string) Part {
	p := Part{Index: idx, Kind: kind}
	if kind == "tool_call" {
		var c struct {
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}
		err := json.Unmarshal([]byte(body), &c)
		if err == nil {
			p.ToolCall = &CallPart{ID: c.ID, Name: c.Name, Input: bound(string(c.Input), MaxTextRunes)}
			return p
		}
		why := "tool call part is not JSON {id, name, input}: " + err.Error()
		p.Malformed = &why
	}
	t := bound(body, MaxTextRunes)
	p.Text = &t
	return p
}

func readClaim(ctx context.Context, tx pgx.Tx, r *Report) error {
	var c Claim
	err := tx.QueryRow(ctx, claimSQL, r.SessionID).Scan(&c.ExecutionID, &c.OwnerID, &c.FencingToken, &c.Phase,
		&c.AssistantMessageID, &c.AcquiredAt, &c.RenewedAt, &c.ExpiresAt, &c.Expired, &c.QuarantineReason, &c.QuarantinedAt)
	if errors.Is(interpretError(err), ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Claim = &c
	return nil
}

func readAttempts(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, attemptsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var a Attempt
	r.Attempts = []Attempt{}
	_, err = pgx.ForEachRow(rows, []any{&a.AttemptID, &a.ExecutionID, &a.AssistantMessageID, &a.Step, &a.Provider, &a.State,
		&a.Tries, &a.IdempotencyKey, &a.FencingToken, &a.Error, &a.InputTokens, &a.OutputTokens, &a.Model, &a.RequestTokens, &a.ResponseID, &a.StartedAt,
		&a.NextRetryAt, &a.FinishedAt}, func() error {
		r.Attempts = append(r.Attempts, a)
		return nil
	})
	return err
}

func readToolCalls(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, toolCallsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var c ToolCall
	var output *string
	r.ToolCalls = []ToolCall{}
	_, err = pgx.ForEachRow(rows, []any{&c.CallID, &c.AttemptID, &c.ExecutionID, &c.Index, &c.ModelCallID, &c.Tool, &c.Class,
		&c.State, &c.IdempotencyKey, &c.FencingToken, &c.IsError, &output, &c.RequestedAt, &c.StartedAt, &c.FinishedAt}, func() error {
		c.Output = nil
		if output != nil {
			t := bound(*output, MaxOutputRunes)
			c.Output = &t
		}
		r.ToolCalls = append(r.ToolCalls, c)
		return nil
	})
	return err
}

func readRecoveries(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, recoveriesSQL, r.SessionID)
	if err != nil {
		return err
	}
	var d Recovery
	r.Recoveries = []Recovery{}
	_, err = pgx.ForEachRow(rows, []any{&d.ExecutionID, &d.PhaseFound, &d.Decision, &d.Rule, &d.ContinuationMessageID,
		&d.RetryAttemptID, &d.TokenBefore, &d.TokenAfter, &d.RecoveredBy, &d.DecidedAt, &d.SettledAt, &d.QuarantineReason}, func() error {
		d.Settled = d.SettledAt != nil
		r.Recoveries = append(r.Recoveries, d)
		return nil
	})
	return err
}

func readResolutions(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, resolutionsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var d Resolution
	var output *string
	r.Resolutions = []Resolution{}
	_, err = pgx.ForEachRow(rows, []any{&d.TargetID, &d.Round, &d.TargetKind, &d.Finding, &output, &d.StateBefore,
		&d.ContinuationMessageID, &d.ResolvedBy, &d.Note, &d.ResolvedAt, &d.SettledAt}, func() error {
		d.Output = nil
		if output != nil {
			t := bound(*output, MaxOutputRunes)
			d.Output = &t
		}
		d.Settled = d.SettledAt != nil
		r.Resolutions = append(r.Resolutions, d)
		return nil
	})
	return err
}

func readPermissions(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, permissionsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var p PermissionRequest
	var message *string
	r.PermissionRequests = []PermissionRequest{}
	_, err = pgx.ForEachRow(rows, []any{&p.RequestID, &p.CallID, &p.Tool, &p.Pattern, &p.Status, &p.Reply, &message,
		&p.AskedAt, &p.RepliedAt, &p.ResumedAt}, func() error {
		p.Message = nil
		if message != nil {
			t := bound(*message, MaxTextRunes)
			p.Message = &t
		}
		r.PermissionRequests = append(r.PermissionRequests, p)
		return nil
	})
	return err
}

func readGrants(ctx context.Context, tx pgx.Tx, r *Report) error {
	rows, err := tx.Query(ctx, grantsSQL, r.SessionID)
	if err != nil {
		return err
	}
	var g PermissionGrant
	r.PermissionGrants = []PermissionGrant{}
	_, err = pgx.ForEachRow(rows, []any{&g.Pattern, &g.RequestID, &g.GrantedAt}, func() error {
		r.PermissionGrants = append(r.PermissionGrants, g)
		return nil
	})
	return err
}

// utc puts every time of the report in UTC, so that its JSON does not
// depend on the server's or the client's time zone, and sets the key
// beside each time that says when it is not a time.
func utc(r *Report) {
	u := func(t *pgdb.Time, notFinite **string) {
		*t = t.UTC()
		*notFinite = t.NotFiniteOrNil()
	}
	up := func(t *pgdb.Time, notFinite **string) {
		*notFinite = nil
		if t != nil {
			u(t, notFinite)
		}
	}
	u(&r.CreatedAt, &r.CreatedAtNotFinite)
	u(&r.LastAdmittedAt, &r.LastAdmittedAtNotFinite)
	up(r.RedrivenAt, &r.RedrivenAtNotFinite)
	r.ReadAt = r.ReadAt.UTC()
	for i := range r.Inputs {
		in := &r.Inputs[i]
		u(&in.AdmittedAt, &in.AdmittedAtNotFinite)
		up(in.PromotedAt, &in.PromotedAtNotFinite)
		up(in.QuarantinedAt, &in.QuarantinedAtNotFinite)
	}
	for i := range r.Transcript {
		m := &r.Transcript[i]
		u(&m.CreatedAt, &m.CreatedAtNotFinite)
		up(m.CompletedAt, &m.CompletedAtNotFinite)
	}
	if c := r.Claim; c != nil {
		u(&c.AcquiredAt, &c.AcquiredAtNotFinite)
		u(&c.RenewedAt, &c.RenewedAtNotFinite)
		u(&c.ExpiresAt, &c.ExpiresNotFinite)
		up(c.QuarantinedAt, &c.QuarantinedAtNotFinite)
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		u(&a.StartedAt, &a.StartedAtNotFinite)
		up(a.NextRetryAt, &a.NextRetryAtNotFinite)
		up(a.FinishedAt, &a.FinishedAtNotFinite)
	}
	for i := range r.ToolCalls {
		c := &r.ToolCalls[i]
		u(&c.RequestedAt, &c.RequestedAtNotFinite)
		up(c.StartedAt, &c.StartedAtNotFinite)
		up(c.FinishedAt, &c.FinishedAtNotFinite)
	}
	for i := range r.Recoveries {
		d := &r.Recoveries[i]
		u(&d.DecidedAt, &d.DecidedAtNotFinite)
		up(d.SettledAt, &d.SettledAtNotFinite)
	}
	for i := range r.Resolutions {
		d := &r.Resolutions[i]
		u(&d.ResolvedAt, &d.ResolvedAtNotFinite)
		up(d.SettledAt, &d.SettledAtNotFinite)
	}
	for i := range r.PermissionRequests {
		p := &r.PermissionRequests[i]
		u(&p.AskedAt, &p.AskedAtNotFinite)
		up(p.RepliedAt, &p.RepliedAtNotFinite)
		up(p.ResumedAt, &p.ResumedAtNotFinite)
	}
	for i := range r.PermissionGrants {
		g := &r.PermissionGrants[i]
		u(&g.GrantedAt, &g.GrantedAtNotFinite)
	}
}

// The queries. Each reads one table of the session, in a stable order.

const sessionSQL = `
SELECT fencing_token, created_at, last_admitted_at, redriven_at, now() FROM sessions WHERE session_id = $1`

const inputsSQL = `
SELECT i.message_id, i.delivery, i.admission_seq, i.admitted_at, i.promotion_seq, i.promoted_at, i.wake_pending,
       EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.message_id = i.message_id),
       i.quarantine_reason, i.quarantined_at, i.source_topic, i.source_partition, i.source_offset, i.text
FROM inputs i WHERE i.session_id = $1 ORDER BY i.admission_seq`

// transcriptSQL looks each message's parts up by its key: a lateral
// subquery that OFFSET 0 keeps from being flattened into a join, which
// skewed statistics planned as a hash of the whole of message_parts
// (TestTranscriptPartsAreLookedUpByMessage; transcript's partsOf).
const transcriptSQL = `
SELECT m.message_id, m.role, m.seq, m.status, m.error, m.turn_id, m.answers, m.tool_call_id, m.is_error,
       m.execution_id, m.fencing_token, m.created_at, m.completed_at, p.idx, p.kind, p.body
FROM messages m LEFT JOIN LATERAL (SELECT p.idx, p.kind, p.body FROM message_parts p WHERE p.message_id = m.message_id OFFSET 0) p ON true
WHERE m.session_id = $1 ORDER BY m.seq, p.idx`

const claimSQL = `
SELECT execution_id, owner_id, fencing_token, phase, assistant_message_id, acquired_at, renewed_at, expires_at,
       expires_at <= now(), quarantine_reason, quarantined_at
FROM claims WHERE session_id = $1`

const attemptsSQL = `
SELECT attempt_id, execution_id, assistant_message_id, step, provider, state, tries, idempotency_key, fencing_token,
       error, input_tokens, output_tokens, model, request_tokens, response_id, started_at, next_retry_at, finished_at
FROM attempts WHERE session_id = $1 ORDER BY started_at, step, attempt_id`

const toolCallsSQL = `
SELECT c.call_id, c.attempt_id, c.execution_id, c.idx, c.model_call_id, c.tool, c.class, c.state, c.idempotency_key,
       c.fencing_token, c.is_error, c.output, c.requested_at, c.started_at, c.finished_at
FROM tool_calls c JOIN attempts a ON a.attempt_id = c.attempt_id AND a.session_id = c.session_id
WHERE c.session_id = $1 ORDER BY a.started_at, a.step, c.attempt_id, c.idx`

const recoveriesSQL = `
SELECT execution_id, phase_found, decision, rule, continuation_message_id, retry_attempt_id, token_before, token_after,
       recovered_by, decided_at, settled_at, quarantine_reason
FROM recoveries WHERE session_id = $1 ORDER BY decided_at, execution_id`

const resolutionsSQL = `
SELECT target_id, round, target_kind, finding, output, state_before, continuation_message_id, resolved_by, note,
       resolved_at, settled_at
FROM resolutions WHERE session_id = $1 ORDER BY resolved_at, target_id, round`

const permissionsSQL = `
SELECT request_id, call_id, tool, pattern, status, reply, message, asked_at, replied_at, resumed_at
FROM permission_requests WHERE session_id = $1 ORDER BY asked_at, request_id`

const grantsSQL = `
SELECT pattern, request_id, granted_at FROM permission_grants WHERE session_id = $1 ORDER BY granted_at, pattern`
