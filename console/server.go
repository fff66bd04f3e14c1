package console

import (
	"cmp"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/metrics"
)

// Config configures a console.
type Config struct {
	// Token, when set, is required on every page (Bearer header or the
	// login form's cookie). Defaults to none: loopback only.
	Token string
	// Logger receives the access log (no prompt texts). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Registry receives the console's metrics and is served at /metrics.
	// Defaults to a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// PageSize is the length of every list page. Defaults to 50.
	PageSize int
	// Topics names the wakes topic of a released input's wake. Defaults to
	// kafkautil's defaults.
	Topics kafkautil.Topics
}

const pageSizeDefault = 50

// Server is the console's HTTP handler.
type Server struct {
	pool    *pgxpool.Pool
	cfg     Config
	auth    *auth
	log     *slog.Logger
	metrics *metrics.Console
	mux     *http.ServeMux
	pages   *template.Template
}

var _ http.Handler = (*Server)(nil)

//go:embed templates/*.html
var templateFS embed.FS

// New builds a console reading pool. config may be nil.
func New(pool *pgxpool.Pool, config *Config) (*Server, error) {
	var cfg Config
	if config != nil {
		cfg = *config
	}
	cfg.PageSize = cmp.Or(cfg.PageSize, pageSizeDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Registry == nil {
		cfg.Registry = metrics.NewRegistry()
	}
	a, err := newAuth(cfg.Token)
	if err != nil {
		return nil, err
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	s := &Server{pool: pool, cfg: cfg, auth: a, log: cfg.Logger, metrics: metrics.NewConsole(cfg.Registry), pages: pages}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/sessions", http.StatusSeeOther) })
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.logout)
	mux.HandleFunc("GET /sessions", s.sessionsPage)
	mux.HandleFunc("GET /session", s.sessionPage)
	mux.HandleFunc("GET /timeline.svg", s.timelineSVG)
	mux.HandleFunc("GET /quarantine", s.quarantinePage)
	mux.HandleFunc("POST /quarantine/release", s.release)
	mux.HandleFunc("GET /recovery", s.recoveryPage)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	s.mux = mux
	return s, nil
}

// routes names the route of a path for the metrics and the access log: a
// fixed set, so that a path cannot grow the label space.
func route(path string) string {
	switch path {
	case "/login", "/logout":
		return "login"
	case "/sessions", "/":
		return "sessions"
	case "/session":
		return "session"
	case "/timeline.svg":
		return "timeline"
	case "/quarantine":
		return "quarantine"
	case "/quarantine/release":
		return "release"
	case "/recovery":
		return "recovery"
	case "/metrics":
		return "metrics"
	}
	return "other"
}

// ServeHTTP authenticates, serves, counts and logs one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &recorder{ResponseWriter: w, code: http.StatusOK}
	rt := route(r.URL.Path)
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with its own form posts, which crossSite must refuse.
	h.Set("Referrer-Policy", "same-origin")
	// No script at all, no external resource: a page is what the server drew.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	s.serve(rw, r, rt)
	d := time.Since(start)
	s.metrics.Observe(rt, rw.code, d.Seconds())
	// The path and the route only: the query (a search) and the bodies
	// (a release's note) stay out of the log, and no page path holds a
	// prompt's text.
	s.log.InfoContext(r.Context(), "console request", slog.String("method", r.Method), slog.String("route", rt),
		slog.String("path", r.URL.Path), slog.Int("status", rw.code), slog.Int64("bytes", rw.bytes),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000))
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, rt string) {
	if r.Method == http.MethodPost {
		// The login form is served to anyone: a body read without a bound
		// (a multipart file part is spooled to disk) would let anyone make
		// the console read gigabytes. Parsed here, once, so that every
		// handler's PostFormValue reads what was parsed.
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		parse := r.ParseForm // ParseMultipartForm would drop its error
		if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "multipart/form-data" {
			parse = func() error { return r.ParseMultipartForm(maxFormBytes) }
		}
		if err := parse(); err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the form is larger than %d bytes", maxFormBytes))
				return
			}
			s.fail(w, r, http.StatusBadRequest, "the form does not parse")
			return
		}
	}
	// What a handler reads goes to Postgres, whose text holds neither
	// bytes that are not UTF-8 nor NUL: refused there, it would be
	// answered as a database failure (503, "reload to try again").
	if name := badText(r.URL.Query(), r.PostForm); name != "" {
		s.fail(w, r, http.StatusBadRequest, name+": not valid UTF-8 text")
		return
	}
	by := s.auth.check(r)
	if r.Method == http.MethodPost && by != authBearer {
		if why := crossSite(r); why != "" {
			s.fail(w, r, http.StatusForbidden, "cross-site request refused: "+why)
			return
		}
	}
	switch {
	case rt == "login" || rt == "metrics":
		s.mux.ServeHTTP(w, r)
	case by == authNone && s.auth.token == "":
		s.fail(w, r, http.StatusForbidden, "this console answers loopback names only (Host "+r.Host+"); give it a token to serve other names")
	case by == authNone:
		if r.Method == http.MethodGet {
			http.Redirect(w, r, "/login?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		s.fail(w, r, http.StatusUnauthorized, "log in first")
	default:
		s.mux.ServeHTTP(w, r)
	}
}

// maxFormBytes bounds a posted form: the largest of the console's forms,
// a release with its note, is a few KiB.
const maxFormBytes = 64 << 10

// badText names the first parameter, of any of sets, whose name or value
// is not valid UTF-8 or holds NUL; "" when there is none.
func badText(sets ...url.Values) string {
	for _, set := range sets {
		for name, values := range set {
			if !validText(name) {
				return "a parameter name"
			}
			for _, v := range values {
				if !validText(v) {
					return name
				}
			}
		}
	}
	return ""
}

func validText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// recorder keeps the status and size of a response.
type recorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (r *recorder) WriteHeader(code int) { r.code = code; r.ResponseWriter.WriteHeader(code) }
func (r *recorder) Write(b []byte) (int, error) {
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, code int, data map[string]any) {
	data["CSRF"] = s.auth.csrf
	data["LoggedIn"] = s.auth.token != "" && s.auth.check(r) == authCookie
	data["Page"] = name
	var b strings.Builder
	if err := s.pages.ExecuteTemplate(&b, name+".html", data); err != nil {
		s.log.ErrorContext(r.Context(), "console: rendering a page", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	s.render(w, r, "error", code, map[string]any{"Title": http.StatusText(code), "Code": code, "Message": msg})
}

// dbFail answers a failed database read: the page says so and may be
// reloaded (a transient error clears by itself).
func (s *Server) dbFail(w http.ResponseWriter, r *http.Request, err error) {
	s.log.ErrorContext(r.Context(), "console: reading the database", slog.String("route", route(r.URL.Path)), slog.String("error", err.Error()))
	s.fail(w, r, http.StatusServiceUnavailable, "reading the database failed; reload to try again: "+err.Error())
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.auth.token == "" {
		http.Redirect(w, r, "/sessions", http.StatusSeeOther)
		return
	}
	s.render(w, r, "login", http.StatusOK, map[string]any{"Title": "Log in", "Next": safeNext(r.URL.Query().Get("next"))})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	if s.auth.token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if !equal(strings.TrimSpace(r.PostFormValue("token")), s.auth.token) {
		s.render(w, r, "login", http.StatusUnauthorized, map[string]any{"Title": "Log in", "Next": next, "Failed": true})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.auth.cookie, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// checkCSRF refuses a browser's form post without this process's token.
// A Bearer client is no browser carrying someone else's cookie: it needs none.
func (s *Server) checkCSRF(w http.ResponseWriter, r *http.Request) bool {
	if s.auth.check(r) == authBearer || equal(r.PostFormValue("csrf"), s.auth.csrf) {
		return true
	}
	s.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or stale; reload the page and try again")
	return false
}

var errBadCursor = errors.New("bad cursor")

// cursor reads a keyset cursor "RFC3339Nano|id"; the time may be
// "-infinity" or "infinity", a row's time that is not a time.
func parseCursor(v string) (pgdb.Time, string, error) {
	if v == "" {
		return pgdb.Time{}, "", nil
	}
	at, id, ok := strings.Cut(v, "|")
	if !ok || id == "" {
		return pgdb.Time{}, "", errBadCursor
	}
	t, err := pgdb.ParseTime(time.RFC3339Nano, at)
	if err != nil {
		return pgdb.Time{}, "", errBadCursor
	}
	return t, id, nil
}

func formatCursor(t pgdb.Time, id string) string {
	return t.UTC().Format(time.RFC3339Nano) + "|" + id
}

func urlQueryEscape(s string) string { return template.URLQueryEscaper(s) }

var funcs = template.FuncMap{
	// ts fails the page on a value of a type it does not know, rather
	// than print nothing where a time belongs.
	"ts": func(t any) (string, error) {
		const layout = "2006-01-02 15:04:05.000Z"
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format(layout), nil
		case pgdb.Time: // "-infinity" or "infinity" when not a time
			return v.UTC().Format(layout), nil
		case *pgdb.Time:
			if v == nil {
				return "—", nil
			}
			return v.UTC().Format(layout), nil
		}
		return "", fmt.Errorf("ts: %T is not a time", t)
	},
	"deref": func(v any) string {
		switch p := v.(type) {
		case *string:
			if p == nil {
				return ""
			}
			return *p
		case *int64:
			if p == nil {
				return ""
			}
			return strconv.FormatInt(*p, 10)
		case *int32:
			if p == nil {
				return ""
			}
			return strconv.FormatInt(int64(*p), 10)
		case *bool:
			if p == nil {
				return ""
			}
			return strconv.FormatBool(*p)
		}
		return ""
	},
	"join": strings.Join,
}
