// Package provider is the contract between the executor and a model: the
// Provider interface, the Request of one provider step and its Response,
// the transcript and tool types they carry, and the error classes that
// decide whether a failed step may be sent again (ErrNotSent,
// *RetryAfterError, ErrOutcomeUnknown, ErrRejected, ErrUnsupported). It is
// a leaf: it imports only the standard library, so that implementations
// need nothing of the executor.
//
// The network providers (HTTP and OpenAI) are in providers/; the scripted
// provider of demos and tests in scripted/.
package provider
