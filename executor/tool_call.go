package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// runCall runs one requested tool call between its intent and its result.
// Invalid input (unknown tool, schema mismatch) is a failed call returned
// to the model, not a crash.
func (ex *execution) runCall(ctx context.Context, turnID string, p ledger.CallParams, c provider.ToolCall, log *slog.Logger) error {
	tool, ok := ex.lookup(c.Name)
	if err := ex.validate(c); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("unknown tool %q", c.Name)
		}
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, "invalid tool call: "+err.Error(), true)
	}
	feedback, err := ex.checkPermission(ctx, p, c)
	if err != nil {
		return err
	}
	if feedback != "" {
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, feedback, true)
	}
	// The intent, retried as the results are: nothing is dispatched until
	// it is known to be committed, and one that committed unheard is found
	// started (retried as it was, it would fail as not requested, and the
	// call, never run, would end unknown).
	intent := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		state, err := ledger.ReadCallState(ctx, tx, p.ID)
		return state == ledger.CallStarted, err
	}
	// One call (promptline_call_start, migration 00022): the call started,
	// the phase unknown, tool.started.
	if err := ex.writeCallRetried(ctx, intent, ledger.PhaseUnknown, "",
		ledger.CallStartCall(p.ID, events(ex.toolEvent(envelope.EventToolStarted, turnID, p, ""))), nil); err != nil {
		return err
	}
	if p.Class == string(tools.SideEffecting) {
		faults.Hit(faults.ToolAfterIntent)
	} else {
		faults.Hit(faults.IdempotentToolAfterIntent)
	}
	sent := time.Now()
	res, err := ex.runTool(ctx, tool, tools.Call{
		ID: c.ID, Name: c.Name, Input: c.Input, SessionID: ex.sessionID,
		IdempotencyKey: p.IdempotencyKey, FencingToken: ex.x.Claim().Token,
	}, p.ID, log)
	faults.Hit(faults.ToolAfterRun)
	ex.callSecondsMetric(ctx, err, res, time.Since(sent))
	if ex.x.Fenced() {
		return ledger.ErrFenced
	}
	var panicked *panicError
	switch {
	case errors.Is(err, tools.ErrNotRun):
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, "not run: "+redact.Text(err.Error()), true)
	case errors.As(err, &panicked):
		// The tool panicked after its dispatch: it may have had effects,
		// so its outcome is unknown, whatever its class (an idempotent
		// call is not run again either: on the input the model chose, it
		// would panic again). Logged with its stack where it was
		// recovered; its value is redacted and bounded (panicText).
		return ex.settleCall(ctx, turnID, p, c, ledger.CallUnknown, "outcome unknown: "+err.Error(), true)
	case err != nil && ctx.Err() != nil:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallUnknown, "outcome unknown: interrupted by shutdown", true)
	case err != nil:
		// The tool could not say how it went: its outcome is unknown, and
		// it is never run again automatically.
		// A tool's error text goes to the model, the transcript and the
		// session events: no URL in it keeps its secrets.
		log.WarnContext(ctx, "tool call outcome unknown", slog.String("call_id", p.ID), slog.Any("error", redact.Error(err)))
		return ex.settleCall(ctx, turnID, p, c, ledger.CallUnknown, "outcome unknown: "+redact.Text(err.Error()), true)
	case res.IsError:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, res.Output, true)
	default:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallSucceeded, res.Output, false)
	}
}

// errToolTimeout is the cause of a tool call's context when ToolTimeout
// passed.
var errToolTimeout = errors.New("tool timeout")

// toolAbandonAfter is how long a tool gets to answer once its context
// ended (deadline or shutdown): one that honours its context answers at
// once and may still say that it did not run (tools.ErrNotRun).
const toolAbandonAfter = 500 * time.Millisecond

// runTool runs one call under the tool deadline. A tool that ignores its
// context (blocked in a system call, say) is abandoned toolAbandonAfter
// past the deadline or the end of the shutdown grace, and its outcome is
// unknown: no tool may keep a turn, or the process's stop, waiting. The
// abandoned goroutine ends when the tool returns, or with the process.
// A tool that panics (or ends its goroutine without returning) fails
// with a *panicError, logged here with its stack (callID names the call),
// abandoned or not: the process goes on.
func (ex *execution) runTool(ctx context.Context, tool tools.Tool, call tools.Call, callID string, log *slog.Logger) (tools.Result, error) {
	d := ex.e.cfg.ToolTimeout
	cctx, cancel := context.WithTimeoutCause(ctx, d, errToolTimeout)
	defer cancel()
	type outcome struct {
		res tools.Result
		err error
	}
	got := make(chan outcome, 1)
	go func() {
		var o outcome
		returned := false
		defer func() {
			if !returned {
				pe := recovered("tool", recover())
				log.ErrorContext(ctx, "tool panicked; the call's outcome is unknown", slog.String("call_id", callID),
					slog.String("tool", call.Name), slog.String("panic", pe.value), slog.String("stack", pe.stack))
				o = outcome{err: pe}
			}
			got <- o
		}()
		faults.Stall(faults.ToolStall)
		o.res, o.err = tool.Run(cctx, call)
		returned = true
	}()
	var o outcome
	select {
	case o = <-got:
	case <-cctx.Done():
		abandon := time.NewTimer(toolAbandonAfter)
		defer abandon.Stop()
		select {
		case o = <-got:
		case <-abandon.C:
			o.err = fmt.Errorf("the tool did not return after its context ended: %w", context.Cause(cctx))
		}
	}
	if o.err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errToolTimeout) {
		o.err = fmt.Errorf("exceeded the tool timeout (%s): %w", d, o.err)
	}
	return o.res, o.err
}

// settleCall records a call's result and its tool message; the last call of
// a step sets the phase continue in the same transaction. After a
// cancellation (a shutdown past its grace) it writes once, on a context
// that outlives it (afterCancel).
func (ex *execution) settleCall(ctx context.Context, turnID string, p ledger.CallParams, c provider.ToolCall, state ledger.CallState, output string, isError bool) error {
	output = storable(output) // a tool's output, or an error's text (storable.go)
	// last: no call of the step is open; idle: none is started (the
	// function then set the phase continue). Set only from a read that
	// succeeded: a first try whose answer was lost may have run its
	// callback on no row. A write that landed unheard is read by settled
	// (WriteCallRetried runs it).
	var last, idle bool
	settled := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		s, l, err := ledger.CallSettled(ctx, tx, p.ID, p.AttemptID)
		if err == nil && s {
			last, idle = l, false // the phase was set by the write that landed, and reported by none
		}
		return s, err
	}
	writeCall := ex.writeCallRetried
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = afterCancel(ctx)
		defer cancel()
		writeCall = ex.writeCallOnce
	}
	// Built once, before the write: not again on each of its tries, and
	// not on the write's goroutine, which would start one more to encode
	// it (eventRow).
	completed := events(ex.toolEvent(envelope.EventToolCompleted, turnID, p, string(state)))
	// One call (promptline_call_settle, migration 00022): the result, the
	// phase continue when no call of the step is started, the tool
	// message and its text, tool.completed.
	err := writeCall(ctx, settled, "", "", ledger.CallSettleCall(p.ID, p.AttemptID, state, output, isError, c.ID, completed),
		func(row pgx.Row) error {
			open, started, err := ledger.ScanCallCounts(row)
			if err != nil {
				return err
			}
			// Set, never accumulated: the callback may run twice.
			last, idle = open == 0, started == 0
			return nil
		})
	if err == nil && idle {
		ex.x.ReportPhase(ledger.PhaseContinue)
	}
	if err == nil {
		ex.callMetric(state)
		if last {
			faults.Hit(faults.StepAfterSettle)
		}
	}
	return err
}

// events are rows as the columns a write's function inserts.
func events(rows ...outbox.Row) ledger.Events {
	topics, keys, payloads := outbox.Columns(rows)
	return ledger.Events{Topics: topics, Keys: keys, Payloads: payloads}
}

// toolSpecs are the registry's tools in the provider's form: one slice
// shared by every request until a tool is registered (Request.Tools is
// read-only), instead of a copy of every schema per request, which at ten
// thousand turns in flight was some 750 bytes each (docs/benchmarks.md,
// "memory per execution in flight").
func (ex *execution) toolSpecs() []provider.ToolSpec {
	reg := ex.e.cfg.Tools
	if reg == nil {
		return nil
	}
	v := reg.Version() // before Specs: a registration in between rebuilds at the next request
	if c := ex.e.toolSpecs.Load(); c != nil && c.version == v {
		return c.specs
	}
	c := &toolSpecsCache{version: v}
	for _, s := range reg.Specs() {
		c.specs = append(c.specs, provider.ToolSpec{Name: s.Name, Description: s.Description, InputSchema: s.InputSchema})
	}
	ex.e.toolSpecs.Store(c)
	return c.specs
}

type toolSpecsCache struct {
	version uint64
	specs   []provider.ToolSpec
}

func (ex *execution) lookup(name string) (tools.Tool, bool) {
	if ex.e.cfg.Tools == nil {
		return nil, false
	}
	return ex.e.cfg.Tools.Lookup(name)
}

// validate checks the call's input against its tool's schema, on a
// goroutine of its own (onOwnStack): decoding the input is as deep as
// encoding an event, and the execution waits on its provider next.
func (ex *execution) validate(c provider.ToolCall) error {
	if ex.e.cfg.Tools == nil {
		return fmt.Errorf("no tools are configured")
	}
	var err error
	onOwnStack(func() { err = ex.e.cfg.Tools.Validate(c.Name, c.Input) })
	return err
}

// classOf is the call's declared class; an unknown tool or an unresolvable
// class counts as side-effecting, the safe assumption. A tool may read
// its class from the input (tools.ClassResolver): that runs on a
// goroutine of its own, and what goes wrong there is bad data, as in the
// tool's Run (P6), with the call side-effecting: a panic or a
// runtime.Goexit (logged with its stack, as runTool logs them), or a
// resolver that has not answered within the tool timeout or before ctx
// ends (abandoned as runTool abandons a tool: its goroutine ends when it
// returns, or with the process). Recovered, a panic may leave the tool's
// own state broken (a lock it held): the next call must not wait on it
// for good, keeping its session's claim renewed and the process's stop
// waiting.
func (ex *execution) classOf(ctx context.Context, c provider.ToolCall) tools.Class {
	t, ok := ex.lookup(c.Name)
	if !ok {
		return tools.SideEffecting
	}
	got := make(chan tools.Class, 1)
	go func() {
		class, returned := tools.SideEffecting, false
		defer func() {
			if !returned {
				pe := recovered("tool class resolver", recover())
				ex.e.log.ErrorContext(ctx, "tool class resolver panicked; the call counts as side-effecting", slog.String("session_id", ex.sessionID),
					slog.String("tool", c.Name), slog.String("panic", pe.value), slog.String("stack", pe.stack))
				class = tools.SideEffecting
			}
			got <- class
		}()
		class = tools.ResolveClass(t, c.Input)
		returned = true
	}()
	d := ex.e.cfg.ToolTimeout
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case class := <-got:
		return class
	case <-timer.C:
	case <-ctx.Done():
	}
	ex.e.log.ErrorContext(ctx, "tool class resolver did not answer; the call counts as side-effecting", slog.String("session_id", ex.sessionID),
		slog.String("tool", c.Name), slog.Duration("tool_timeout", d), slog.Bool("context_done", ctx.Err() != nil))
	return tools.SideEffecting
}
