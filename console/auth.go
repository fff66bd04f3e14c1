package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// cookieName is the login cookie's name.
const cookieName = "promptline_console"

// ErrNonLoopback says that the console was asked to listen beyond
// loopback without a token.
var ErrNonLoopback = errors.New("the console serves a non-loopback address only with a token (--console-token-file)")

// CheckAddr refuses a listen address other than loopback when the console
// has no token: an unauthenticated console shows prompt texts, so it must
// not be reachable from another machine.
func CheckAddr(addr string, hasToken bool) error {
	if hasToken {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", addr, err)
	}
	if !loopbackHost(host) {
		return fmt.Errorf("--addr %q: %w", addr, ErrNonLoopback)
	}
	return nil
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// auth holds the secrets of one console process.
type auth struct {
	token  string // "" when the console has none
	cookie string // the login cookie's value: an HMAC of the token
	csrf   string // the forms' CSRF token: random per process
}

func newAuth(token string) (*auth, error) {
	a := &auth{token: token}
	if token != "" {
		m := hmac.New(sha256.New, []byte(token))
		m.Write([]byte("promptline console session v1"))
		a.cookie = hex.EncodeToString(m.Sum(nil))
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("making the CSRF token: %w", err)
	}
	a.csrf = hex.EncodeToString(b[:])
	return a, nil
}

// how a request was authenticated.
type authBy int

const (
	authNone   authBy = iota // refused
	authOpen                 // no token configured (loopback only)
	authBearer               // Authorization: Bearer
	authCookie               // the login cookie
)

func (a *auth) check(r *http.Request) authBy {
	if a.token == "" {
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		if !loopbackHost(host) {
			return authNone
		}
		return authOpen
	}
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(strings.TrimSpace(h), a.token) {
		return authBearer
	}
	if c, err := r.Cookie(cookieName); err == nil && equal(c.Value, a.cookie) {
		return authCookie
	}
	return authNone
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// crossSite says why a state-changing request looks cross-site, or "".
// Browsers send Origin on every POST (and Sec-Fetch-Site); a request from
// a page of another site names it there. A client that sends neither is
// not a browser on another site's page; the CSRF token still applies.
func crossSite(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return "Origin " + o + " is not this console"
		}
		return ""
	}
	switch s := r.Header.Get("Sec-Fetch-Site"); s {
	case "", "same-origin", "none":
		return ""
	default:
		return "Sec-Fetch-Site " + s
	}
}

// safeNext is where the login form may send the browser back: a path of
// this console, never another site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/sessions"
	}
	return next
}
