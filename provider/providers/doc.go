// Package providers holds the provider.Provider implementations that talk
// to a model over the network: HTTP, which POSTs each step as documented
// JSON to any service (docs/providers.md), and OpenAI, which speaks the
// Chat Completions API with tool calling to api.openai.com or a
// compatible server.
//
// Both classify failures as provider.Provider requires, because the class
// decides whether the executor may send the step again (P4):
//
//   - provider.ErrNotSent only when dialing failed, so the request never
//     left; a reset or EOF after the connection existed is not proof;
//   - provider.ErrOutcomeUnknown when the request may have arrived and no
//     complete answer came back: reset, EOF, timeout, cancellation, a
//     response body cut off;
//   - *provider.RetryAfterError for HTTP 429 and 503, with the delay of
//     Retry-After (seconds or HTTP-date; 1s when absent; at most 5m);
//   - provider.ErrUnsupported for a transcript they cannot encode;
//   - provider.ErrRejected when the server refused the request itself: a
//     redirect (not followed) or a 4xx other than 408, 409, 425 and 429
//     (400 bad request, 401 bad key, 403, 404 unknown model, 422, ...),
//     which the same request would meet again;
//   - a plain error when the server answered with a failure: any other
//     status (500, 502, 504, 408, 409, 425), or a malformed answer.
//
// They never retry by themselves, and they keep net/http from doing so
// either: a request carrying an Idempotency-Key header is replayed by
// net/http's Transport after a failure on a reused connection, which is
// only safe when the server deduplicates by that key (see
// setIdempotencyKey). Redirects are not followed. API keys and header
// values never appear in errors or in printed configs.
package providers
