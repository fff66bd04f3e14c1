package providers

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	urlredact "github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/provider"
)

const (
	// timeoutDefault bounds one provider step when the config sets none.
	timeoutDefault = 120 * time.Second
	// retryAfterDefault is the delay of a 429 or 503 without a usable
	// Retry-After header.
	retryAfterDefault = time.Second
	// retryAfterMax caps the delay a server may ask for: a step waits
	// durably, but not for hours on a misconfigured proxy's say-so.
	retryAfterMax = 5 * time.Minute
	// excerptMax bounds how much of an error response's body goes into an
	// error message.
	excerptMax = 512
	// responseMax bounds a successful response's body; a provider step
	// that answers more than this is treated as malformed.
	responseMax = 16 << 20
	// redacted replaces secrets wherever they would otherwise be printed.
	redacted = "[REDACTED]"
)

// exchangeOpts is one POST of a provider step.
type exchangeOpts struct {
	URL     string
	Body    []byte
	Headers map[string]string
	// Secret, when set, is removed from anything the server sends back
	// before it can reach an error message (some servers echo the API
	// key they rejected).
	Secret string
	// IdempotencyKey is sent as the Idempotency-Key header.
	IdempotencyKey string
	// HonoursIdempotencyKeys says whether the server deduplicates by
	// IdempotencyKey; see setIdempotencyKey.
	HonoursIdempotencyKeys bool
	FencingToken           int64
	Timeout                time.Duration
	// Accept is the Accept header. Defaults to application/json.
	Accept string
	// StreamFunc, when set, reads a 2xx response's body as it arrives
	// (within Timeout) and returns the answer's body; its errors are
	// returned as they are. Defaults to reading the body whole.
	StreamFunc func(contentType string, body io.Reader) ([]byte, error)
	// ResponseIDFunc takes the answer's request ID header
	// (responseIDHeaders) as soon as the headers arrive, whatever the
	// status. Optional.
	ResponseIDFunc func(id string)
}

// responseIDHeaders name the request ID a provider answers with, in the
// order they are looked for (OpenAI and most gateways send X-Request-Id).
var responseIDHeaders = []string{"X-Request-Id", "Request-Id", "X-Amzn-Requestid", "Cf-Ray"}

// responseID is the first request ID header of h, or "".
func responseID(h http.Header) string {
	for _, name := range responseIDHeaders {
		if v := h.Get(name); v != "" {
			return v
		}
	}
	return ""
}

// noRedirects returns a shallow copy of client that does not follow
// redirects. Following one would resend the step (307/308) or turn the
// POST into a GET (301/302/303): either way the answer would not be the
// answer to the step, so a redirect is reported as a status error instead.
func noRedirects(client *http.Client) *http.Client {
	if client == nil {
		client = http.DefaultClient
	}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// exchange POSTs opts.Body and returns the body of a 2xx response. Its
// errors follow the classes of provider.Provider: ErrNotSent when the
// request certainly did not leave; ErrOutcomeUnknown when it may have
// arrived and no complete answer came back (reset, EOF, timeout,
// cancellation, a body cut off); *provider.RetryAfterError for 429 and
// 503; ErrRejected for a status that refuses the request itself
// (refusesRequest); a plain error when the server answered with another
// failure.
func exchange(ctx context.Context, client *http.Client, opts exchangeOpts) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(opts.Timeout, timeoutDefault))
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, opts.URL, bytes.NewReader(opts.Body))
	if err != nil {
		// Built nothing, sent nothing; the message of url.Parse errors
		// holds only the URL, which is configuration, not a secret.
		return nil, fmt.Errorf("building request: %w: %w", provider.ErrNotSent, err)
	}
	for name, value := range opts.Headers {
		req.Header.Set(name, value)
	}
	// Only this step's key may mark it idempotent, and only as
	// setIdempotencyKey decides.
	req.Header.Del("Idempotency-Key")
	req.Header.Del("X-Idempotency-Key")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", cmp.Or(opts.Accept, "application/json"))
	req.Header.Set("X-Fencing-Token", strconv.FormatInt(opts.FencingToken, 10))
	setIdempotencyKey(req.Header, opts.IdempotencyKey, opts.HonoursIdempotencyKeys)
	if !opts.HonoursIdempotencyKeys || opts.IdempotencyKey == "" {
		// net/http resends a request whose body it can rewind (GetBody,
		// set for a bytes.Reader) when the connection fails after the
		// request was written: HTTP/2 does so on a stream reset with
		// PROTOCOL_ERROR whatever the method, so a step the server had
		// read went out again, behind the ledger's back, and a dial
		// refused on the resend made the whole call read as not sent
		// (P4). Without GetBody only what was never written is retried.
		req.GetBody = nil
	}

	resp, err := client.Do(req)
	if err != nil {
		// The error names the URL; it is stored, published and logged.
		err = urlredact.Error(err)
		if notSent(err) {
			return nil, fmt.Errorf("%w: %w", provider.ErrNotSent, err)
		}
		return nil, fmt.Errorf("%w: %w", provider.ErrOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	if id := responseID(resp.Header); id != "" && opts.ResponseIDFunc != nil {
		opts.ResponseIDFunc(id)
	}

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		excerpt := readExcerpt(resp.Body, opts.Secret)
		var statusErr error = &provider.StatusError{Code: resp.StatusCode, Err: fmt.Errorf("status %s: %q", resp.Status, excerpt)}
		if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
			statusErr = &provider.StatusError{Code: resp.StatusCode,
				Err: fmt.Errorf("status %s (redirects are not followed; location %q)", resp.Status, urlredact.URL(resp.Header.Get("Location")))}
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			return nil, &provider.RetryAfterError{
				After: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
				Err:   statusErr,
			}
		}
		if refusesRequest(resp.StatusCode) {
			return nil, fmt.Errorf("%w: %w", provider.ErrRejected, statusErr)
		}
		return nil, statusErr
	}

	if opts.StreamFunc != nil {
		return opts.StreamFunc(resp.Header.Get("Content-Type"), resp.Body)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, responseMax+1))
	if err != nil {
		// The answer was cut off: what the server did is not known.
		return nil, fmt.Errorf("%w: reading response (status %s): %w", provider.ErrOutcomeUnknown, resp.Status, err)
	}
	if len(body) > responseMax {
		return nil, fmt.Errorf("malformed response (status %s): larger than %d bytes", resp.Status, responseMax)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, fmt.Errorf("malformed response (status %s): empty body", resp.Status)
	}
	return body, nil
}

// setIdempotencyKey sets the Idempotency-Key header.
//
// net/http's Transport treats a POST whose Header map holds the canonical
// key "Idempotency-Key" as idempotent, and then silently resends it on a
// new connection when a reused one fails after the request was written.
// That is right only when the server deduplicates by the key. Otherwise
// the header goes into the map under its lower-case spelling: on the wire
// it is the same header (names are case-insensitive; HTTP/2 lower-cases
// them anyway), but the Transport no longer replays the request, so a
// step that may have reached the provider is never repeated behind the
// ledger's back (P4). Failures before anything was written are still
// retried by the Transport, which is safe.
func setIdempotencyKey(h http.Header, key string, honoured bool) {
	if key == "" {
		return
	}
	if honoured {
		h.Set("Idempotency-Key", key)
		return
	}
	h["idempotency-key"] = []string{key}
}

// notSent reports whether err proves that the request never left: a
// failure to dial (connection refused, no route, DNS), possibly of the
// proxy. Anything after the connection exists — a reset, an EOF, a
// timeout — may come after the server read the request.
func notSent(err error) bool {
	for err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			if op.Op == "dial" {
				return true
			}
			// A "proxyconnect" error wraps the proxy's own failure;
			// look inside it for a dial.
			err = op.Err
			continue
		}
		return false
	}
	return false
}

// refusesRequest says whether a status refuses the request itself, so that
// the same request would be refused again: a redirect (not followed) and
// the 4xx statuses, except those that say "later" or "not now" — 408
// Request Timeout, 409 Conflict (a server deduplicating by idempotency key
// answers it while the first send of the key is in flight), 425 Too Early
// and 429 Too Many Requests.
func refusesRequest(status int) bool {
	switch {
	case status >= 300 && status <= 399:
		return true
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return false
	}
	return status >= 400 && status <= 499
}

// parseRetryAfter reads a Retry-After header as delay-seconds or as an
// HTTP-date (RFC 9110, section 10.2.3). An absent or unreadable value
// means retryAfterDefault; the result lies in [0, retryAfterMax].
func parseRetryAfter(value string, now time.Time) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return retryAfterDefault
	}
	var after time.Duration
	if secs, err := strconv.ParseInt(value, 10, 64); err == nil {
		if secs < 0 {
			return retryAfterDefault
		}
		if secs > int64(retryAfterMax/time.Second) {
			return retryAfterMax
		}
		after = time.Duration(secs) * time.Second
	} else if at, err := http.ParseTime(value); err == nil {
		after = at.Sub(now)
	} else {
		return retryAfterDefault
	}
	return min(max(after, 0), retryAfterMax)
}

// readExcerpt reads at most excerptMax bytes of an error body, with
// secret removed. Callers print it with %q, which escapes whatever is not
// valid UTF-8.
func readExcerpt(r io.Reader, secret string) string {
	// Read past the bound by the secret's length, so that a secret that
	// straddles the bound is still seen whole and removed.
	b, _ := io.ReadAll(io.LimitReader(r, int64(excerptMax+len(secret))))
	s := redact(string(b), secret)
	if len(s) <= excerptMax {
		return s
	}
	cut := excerptMax
	// Do not leave half a marker.
	for i := max(0, cut-len(redacted)+1); i < cut; i++ {
		if strings.HasPrefix(s[i:], redacted) {
			cut = i
			break
		}
	}
	return redactTail(s[:cut], secret)
}

// redact removes every occurrence of secret from s.
func redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, redacted)
}

// redactTail removes a cut-off beginning of secret from the end of s.
func redactTail(s, secret string) string {
	for n := min(len(secret)-1, len(s)); n >= 1; n-- {
		if strings.HasSuffix(s, secret[:n]) {
			return s[:len(s)-n]
		}
	}
	return s
}
