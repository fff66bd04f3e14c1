package tools

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/promptline/promptline/internal/redact"
)

// maxResponseBody bounds the response body returned to the model.
const maxResponseBody = 64 << 10

// Headers that http_request sets on every request; an endpoint may not set
// them itself.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderFencingToken   = "X-Fencing-Token"
)

// Endpoint is one request the http_request tool may send. The model chooses
// an endpoint by name and may supply a JSON body; it never supplies a URL.
type Endpoint struct {
	// Name is what the model passes as "endpoint"; it must match
	// ^[a-zA-Z0-9_-]{1,64}$.
	Name string
	// URL is the absolute http or https URL the request goes to.
	URL string
	// Method is the HTTP method. Defaults to POST.
	Method string
	// Class says whether a call of this endpoint may be sent again when
	// its outcome is unknown: Idempotent only if the receiving system
	// deduplicates on the Idempotency-Key header (or the request has no
	// effect). Defaults to SideEffecting.
	Class Class
	// Headers are added to every request to this endpoint (for example
	// an Authorization header); they may not set Idempotency-Key or
	// X-Fencing-Token. Defaults to none.
	Headers map[string]string
	// Description tells the model what the endpoint does. Defaults to
	// none.
	Description string
}

type httpRequest struct {
	client    *http.Client
	endpoints map[string]Endpoint
	spec      Spec
}

var _ ClassResolver = (*httpRequest)(nil)

// NewHTTPRequest returns the http_request tool, which sends a request to one
// of the configured endpoints. Its input is
//
//	{"endpoint": <one of the configured names>, "body": <any JSON, optional>}
//
// and the schema enumerates the configured names, so a call of any other
// endpoint fails validation. The body, when present, is sent as
// application/json (unless the endpoint's headers set another Content-Type).
// Every request carries the headers Idempotency-Key (Call.IdempotencyKey,
// when not empty) and X-Fencing-Token (Call.FencingToken), so the receiving
// system can deduplicate a re-run and refuse a call from a superseded
// execution.
//
// The outcome: a 2xx response is a Result whose Output is the response body
// (bounded to 64 KiB); any other status is a Result with IsError and Output
// "HTTP <status>: <body>" (bounded the same way). Redirects are not
// followed: a 3xx is a non-2xx status. A transport error is an error from
// Run; it wraps ErrNotRun when no connection was made, so nothing was sent.
// Errors (from Run and from NewHTTPRequest) never carry the URL's password
// or its secret query parameters (token, key, api_key, secret, password,
// sig, ...): they reach the model, the transcript and the session events.
//
// Class: each endpoint has its own, so the tool implements ClassResolver and
// its ClassOf returns the class of the endpoint named in the input.
// Spec().Class is SideEffecting, the safe answer when the input names no
// configured endpoint. For a SideEffecting endpoint the request is built so
// that net/http never sends it a second time on its own (its transport
// otherwise retries a request that carries an Idempotency-Key when a reused
// connection fails).
//
// client defaults to a new http.Client; it is copied, not modified, and its
// redirect policy is replaced. NewHTTPRequest fails when there is no
// endpoint, or an endpoint has a bad name, a repeated name, a URL that is
// not absolute http(s), a bad method, an unknown class, or a header that is
// malformed or reserved.
func NewHTTPRequest(client *http.Client, endpoints []Endpoint) (Tool, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("http_request: no endpoint configured")
	}
	c := http.Client{}
	if client != nil {
		c = *client
	}
	// The configured URL is the only destination: a redirect would send
	// the call somewhere nobody configured (and re-send its body).
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	byName := make(map[string]Endpoint, len(endpoints))
	names := make([]string, 0, len(endpoints))
	var desc strings.Builder
	desc.WriteString("Sends an HTTP request to one of the configured endpoints and returns the response body. Endpoints:")
	for _, ep := range endpoints {
		ep.Method = cmp.Or(ep.Method, http.MethodPost)
		ep.Class = cmp.Or(ep.Class, SideEffecting)
		if err := checkEndpoint(ep); err != nil {
			// Printed at start-up: never the URL's secrets.
			return nil, redact.Error(fmt.Errorf("http_request: endpoint %q: %w", ep.Name, err))
		}
		if _, ok := byName[ep.Name]; ok {
			return nil, fmt.Errorf("http_request: endpoint %q configured twice", ep.Name)
		}
		ep.Headers = maps.Clone(ep.Headers)
		byName[ep.Name] = ep
		names = append(names, ep.Name)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&desc, "\n- %s", n)
		if d := byName[n].Description; d != "" {
			fmt.Fprintf(&desc, ": %s", d)
		}
	}

	schema, err := json.Marshal(map[string]any{
		"type": "object",
		"properties": map[string]any{
			"endpoint": map[string]any{"type": "string", "enum": names, "description": "The name of the endpoint to call."},
			"body":     map[string]any{"description": "The JSON body to send, if any."},
		},
		"required":             []string{"endpoint"},
		"additionalProperties": false,
	})
	if err != nil {
		return nil, fmt.Errorf("http_request: building schema: %w", err)
	}
	return &httpRequest{
		client:    &c,
		endpoints: byName,
		spec: Spec{
			Name:        "http_request",
			Description: desc.String(),
			InputSchema: schema,
			Class:       SideEffecting,
		},
	}, nil
}

func checkEndpoint(ep Endpoint) error {
	if !namePattern.MatchString(ep.Name) {
		return fmt.Errorf("name must match %s", namePattern)
	}
	u, err := url.Parse(ep.URL)
	if err != nil {
		return fmt.Errorf("URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("URL %q: want an absolute http or https URL", redact.URL(ep.URL))
	}
	if !isToken(ep.Method) {
		return fmt.Errorf("bad method %q", ep.Method)
	}
	if !ep.Class.valid() {
		return fmt.Errorf("unknown class %q (want %q or %q)", ep.Class, Idempotent, SideEffecting)
	}
	for k, v := range ep.Headers {
		if !isToken(k) || strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("bad header %q", k)
		}
		switch http.CanonicalHeaderKey(k) {
		case HeaderIdempotencyKey, HeaderFencingToken, "X-Idempotency-Key":
			return fmt.Errorf("header %q is set by http_request itself", k)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110), as methods and
// header names must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

func (h *httpRequest) Spec() Spec {
	s := h.spec
	s.InputSchema = bytes.Clone(s.InputSchema)
	return s
}

// ClassOf returns the class of the endpoint the input names, SideEffecting
// when it names none that is configured.
func (h *httpRequest) ClassOf(input json.RawMessage) Class {
	in, err := decodeHTTPInput(input)
	if err != nil {
		return SideEffecting
	}
	ep, ok := h.endpoints[in.Endpoint]
	if !ok {
		return SideEffecting
	}
	return ep.Class
}

type httpInput struct {
	Endpoint string          `json:"endpoint"`
	Body     json.RawMessage `json:"body"`
}

func decodeHTTPInput(input json.RawMessage) (httpInput, error) {
	var in httpInput
	err := json.Unmarshal(input, &in)
	return in, err
}

// opaqueBody hides the reader's type from net/http, so that it sets no
// GetBody: with a body it cannot rewind, the transport never re-sends the
// request on its own, even when it carries an Idempotency-Key.
type opaqueBody struct{ r io.Reader }

func (b opaqueBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (h *httpRequest) Run(ctx context.Context, call Call) (Result, error) {
	in, err := decodeHTTPInput(call.Input)
	if err != nil {
		return refuse(`invalid input: want {"endpoint": string, "body": any JSON}`), nil
	}
	ep, ok := h.endpoints[in.Endpoint]
	if !ok {
		return refuse(fmt.Sprintf("unknown endpoint %q", bound(in.Endpoint, 128))), nil
	}

	var payload []byte
	if len(in.Body) > 0 && !bytes.Equal(in.Body, []byte("null")) {
		payload = in.Body
	}
	var body io.Reader
	switch {
	case ep.Class != Idempotent:
		body = opaqueBody{r: bytes.NewReader(payload)}
	case payload != nil:
		body = bytes.NewReader(payload) // may be re-sent, with the same key
	default:
		body = http.NoBody
	}

	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, ep.Method, ep.URL, body)
	if err != nil {
		return Result{}, fmt.Errorf("http_request %s: building request: %w: %w", ep.Name, ErrNotRun, redact.Error(err))
	}
	req.ContentLength = int64(len(payload))
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	if call.IdempotencyKey != "" {
		req.Header.Set(HeaderIdempotencyKey, call.IdempotencyKey)
	}
	req.Header.Set(HeaderFencingToken, strconv.FormatInt(call.FencingToken, 10))

	resp, err := h.client.Do(req)
	if err != nil {
		// The error names the URL (a *url.Error); it goes to the model,
		// the transcript and the session events: its secrets are masked.
		err = redact.Error(err)
		if !connected.Load() {
			// No connection, so not a byte of the request went out.
			return Result{}, fmt.Errorf("http_request %s: %w: %w", ep.Name, ErrNotRun, err)
		}
		return Result{}, fmt.Errorf("http_request %s: outcome unknown: %w", ep.Name, err)
	}
	defer resp.Body.Close()

	// The status is the outcome; a body cut short does not change it.
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	text := string(data)
	if err != nil {
		text += fmt.Sprintf("\n[reading the response body failed: %v]", redact.Text(err.Error()))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return Result{IsError: true, Output: bound(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, text), maxResponseBody)}, nil
	}
	return Result{Output: bound(text, maxResponseBody)}, nil
}
