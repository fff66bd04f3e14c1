package console

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/recovery"
)

func (s *Server) sessionsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state, search := q.Get("state"), strings.TrimSpace(q.Get("q"))
	at, id, err := parseCursor(q.Get("after"))
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "after: not a cursor of this list")
		return
	}
	rows, next, err := inspect.ListSessions(r.Context(), s.pool, inspect.ListParams{
		State: state, Search: search, After: inspect.Cursor{CreatedAt: at, SessionID: id}, Limit: s.cfg.PageSize})
	if errors.Is(err, inspect.ErrUnknownState) {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	nextURL := ""
	if !next.IsZero() {
		v := url.Values{"after": {formatCursor(next.CreatedAt, next.SessionID)}}
		if state != "" {
			v.Set("state", state)
		}
		if search != "" {
			v.Set("q", search)
		}
		nextURL = "/sessions?" + v.Encode()
	}
	s.render(w, r, "sessions", http.StatusOK, map[string]any{"Title": "Sessions", "Rows": rows, "State": state,
		"Search": search, "States": inspect.States, "Next": nextURL, "Paged": id != ""})
}

// decision is a recovery decision with its evidence in the words of
// `consumer recovery explain`.
type decision struct {
	recovery.Record
	Words string
}

func (s *Server) sessionPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	rep, err := inspect.Session(r.Context(), s.pool, id)
	if errors.Is(err, inspect.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "no session "+id)
		return
	}
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	recs, err := recovery.Records(r.Context(), s.pool, id)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	releases, err := inspect.Releases(r.Context(), s.pool, id)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	decisions := make([]decision, len(recs))
	for i, rec := range recs {
		var b strings.Builder
		recovery.Explain(&b, []recovery.Record{rec})
		decisions[i] = decision{Record: rec, Words: b.String()}
	}
	s.render(w, r, "session", http.StatusOK, map[string]any{"Title": "Session " + id, "R": rep, "Decisions": decisions,
		"Releases": releases, "Timeline": drawTimeline(rep, recs, releases)})
}

func (s *Server) timelineSVG(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	rep, err := inspect.Session(r.Context(), s.pool, id)
	if errors.Is(err, inspect.ErrNotFound) {
		http.Error(w, "no such session", http.StatusNotFound)
		return
	}
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	recs, err := recovery.Records(r.Context(), s.pool, id)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	releases, err := inspect.Releases(r.Context(), s.pool, id)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	var b strings.Builder
	if err := s.pages.ExecuteTemplate(&b, "timeline_doc.html", drawTimeline(rep, recs, releases)); err != nil {
		http.Error(w, "rendering the timeline failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(b.String()))
}

func (s *Server) quarantinePage(w http.ResponseWriter, r *http.Request) {
	rows, err := recovery.ListQuarantined(r.Context(), s.pool)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	s.render(w, r, "quarantine", http.StatusOK, map[string]any{"Title": "Quarantine", "Rows": rows,
		"Released": r.URL.Query().Get("released")})
}

// release is `consumer quarantine release` from a form: the same audited
// recovery.Release, with the operator and note the form names.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	if !s.checkCSRF(w, r) {
		return
	}
	kind, id := r.PostFormValue("kind"), r.PostFormValue("id")
	operator, note := strings.TrimSpace(r.PostFormValue("operator")), strings.TrimSpace(r.PostFormValue("note"))
	if operator == "" {
		s.fail(w, r, http.StatusBadRequest, "operator: name who releases the row (it is recorded in the audit)")
		return
	}
	err := recovery.Release(r.Context(), s.pool, kind, id, &recovery.ReleaseOpts{Operator: operator, Note: note, Topics: s.cfg.Topics})
	switch {
	case errors.Is(err, recovery.ErrNotQuarantined):
		s.fail(w, r, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, recovery.ErrStillInvalid):
		s.fail(w, r, http.StatusConflict, err.Error())
		return
	case err != nil && strings.HasPrefix(err.Error(), "unknown kind"):
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		s.dbFail(w, r, err)
		return
	}
	s.log.InfoContext(r.Context(), "console: quarantined row released", "kind", kind, "id", id, "operator", operator)
	http.Redirect(w, r, "/quarantine?"+url.Values{"released": {kind + " " + id}}.Encode(), http.StatusSeeOther)
}

// decisions lists the kinds of recovery decisions, for the filter.
var decisionKinds = []recovery.DecisionKind{recovery.DecisionCleared, recovery.DecisionSuperseded, recovery.DecisionRewoken,
	recovery.DecisionContinued, recovery.DecisionReconciled, recovery.DecisionQuarantined}

func (s *Server) recoveryPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	kind := q.Get("decision")
	at, id, err := parseCursor(q.Get("after"))
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "after: not a cursor of this list")
		return
	}
	rows, next, err := inspect.RecentRecoveries(r.Context(), s.pool, kind, inspect.RecoveryCursor{DecidedAt: at, ExecutionID: id}, s.cfg.PageSize)
	if err != nil {
		s.dbFail(w, r, err)
		return
	}
	nextURL := ""
	if !next.IsZero() {
		v := url.Values{"after": {formatCursor(next.DecidedAt, next.ExecutionID)}}
		if kind != "" {
			v.Set("decision", kind)
		}
		nextURL = "/recovery?" + v.Encode()
	}
	s.render(w, r, "recovery", http.StatusOK, map[string]any{"Title": "Recovery", "Rows": rows, "Decision": kind,
		"Kinds": decisionKinds, "Next": nextURL})
}
