package executor

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/promptline/promptline/ledger"
)

// responseIDTimeout bounds the best-effort write of a response ID: the
// step waits for it (at most this long) after the provider returns, so
// that no write outlives its step.
const responseIDTimeout = 2 * time.Second

// responseIDMaxBytes bounds a recorded response ID: it comes from outside.
const responseIDMaxBytes = 256

// responseIDWrite records the first response ID a provider reports for an
// attempt while the attempt is in flight: a fenced write of its own
// (ledger.RecordResponseID), in a goroutine, so that report never blocks
// the provider's stream. It is best effort: a failure is logged and
// counted, and the turn goes on (the ID is then recorded with the
// outcome, when the step gets that far).
//
// Crash windows: a crash before its commit leaves the attempt started
// without an ID (as before this write existed); one after leaves it
// started with its ID, which recovery reconciles as unknown as ever. The
// write changes no phase and no state, so it opens no window of its own;
// behind the fence, a zombie's write is refused (and fences it).
type responseIDWrite struct {
	ex        *execution
	attemptID string
	log       *slog.Logger

	mu   sync.Mutex
	id   string
	done chan struct{} // closed when the write ended; nil until it began
}

func (ex *execution) responseIDRecorder(attemptID string, log *slog.Logger) *responseIDWrite {
	return &responseIDWrite{ex: ex, attemptID: attemptID, log: log}
}

// report is provider.Request.ResponseIDFunc.
func (w *responseIDWrite) report(id string) {
	id = cleanResponseID(id)
	if id == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done != nil {
		return
	}
	w.id, w.done = id, make(chan struct{})
	go w.write(id, w.done)
}

func (w *responseIDWrite) write(id string, done chan struct{}) {
	defer close(done)
	x := w.ex.x
	ctx, cancel := context.WithTimeout(x.Context(), responseIDTimeout)
	defer cancel()
	_, err := x.RecordResponseID(ctx, w.attemptID, id)
	switch {
	case err == nil:
	case errors.Is(err, ledger.ErrFenced):
		// Counted and logged by the ledger; the step stops on its own.
	default:
		if f := w.ex.e.cfg.OnResponseIDWriteFailedFunc; f != nil {
			f()
		}
		w.log.WarnContext(ctx, "recording the provider's response ID failed; the turn goes on",
			slog.String("attempt_id", w.attemptID), slog.Any("error", err))
	}
}

// wait waits for the write, if one began, and returns the ID reported.
func (w *responseIDWrite) wait() string {
	w.mu.Lock()
	id, done := w.id, w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
	return id
}

// keepResponseID remembers an attempt's response ID (of its latest try)
// for its outcome's write. A try that reported none forgets an earlier
// try's: a deferred attempt begun again starts without an ID
// (beginAttemptSQL), and the outcome must not name another try's.
//
// It keeps that attempt's only. An execution's steps run one after
// another, each attempt's outcome written (or the execution ended)
// before the next attempt begins: every other attempt it remembered has
// settled, and its ID is dropped. Kept, one entry per attempt grew
// without bound in an execution kept busy turn after turn.
func (ex *execution) keepResponseID(attemptID, id string) {
	clear(ex.responseIDs)
	if id == "" {
		return
	}
	if ex.responseIDs == nil {
		ex.responseIDs = map[string]string{}
	}
	ex.responseIDs[attemptID] = id
}

// cleanResponseID makes an ID from outside storable and bounded: valid
// UTF-8 without NUL or control characters, at most responseIDMaxBytes.
func cleanResponseID(id string) string {
	id = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(strings.TrimSpace(id), ""))
	if len(id) > responseIDMaxBytes {
		id = strings.ToValidUTF8(id[:responseIDMaxBytes], "")
	}
	return id
}
