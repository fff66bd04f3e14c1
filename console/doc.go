// Package console is promptline's operator console: a small web server
// (`consumer console`, docs/console.md) that shows what `consumer session
// show`, `consumer recovery explain` and `consumer quarantine list` print,
// plus one picture they cannot: a session's life as a timeline.
//
// It reads through the same functions as those commands (internal/inspect
// and recovery's readers), so console and CLI say the same; its one write,
// releasing a quarantined row, is recovery.Release, the audited path of
// `consumer quarantine release`. It holds no SQL of its own.
//
// Pages are server-rendered HTML (html/template: everything that came
// from a prompt, a model or a tool is escaped), readable without
// JavaScript; the timeline is an SVG drawn on the server, with no script
// and no external font. Every list is paged by index (keyset cursors).
//
// Security: with a token (Config.Token) every page needs it, as an
// `Authorization: Bearer` header or the cookie the login form sets
// (HttpOnly, SameSite=Strict; it holds an HMAC of the token, not the
// token). Without a token the console serves loopback only (CheckAddr)
// and answers only requests whose Host is a loopback name, so that a
// DNS-rebinding page cannot read it. Every form that changes something
// carries a per-process CSRF token, and a POST whose Origin (or
// Sec-Fetch-Site) names another site is refused. The access log names
// the route, path, status and latency, never a prompt text.
package console
