package pipeline

import (
	"context"
	"errors"
)

// Provider produces the assistant's answer for a turn. Implementations must
// honour ctx: a cancelled turn returns promptly.
type Provider interface {
	Complete(ctx context.Context, req ProviderRequest) (ProviderResponse, error)
}

// ProviderRequest is one provider step of a turn.
type ProviderRequest struct {
	SessionID          string
	AssistantMessageID string
	// Messages is the session's transcript, oldest first, ending with the
	// user messages of this turn.
	Messages []TranscriptMessage
	// Turn lists the user messages this turn answers.
	Turn []TranscriptMessage
}

// TranscriptMessage is one message as a provider sees it.
type TranscriptMessage struct {
	ID   string
	Role string // "user" or "assistant"
	Text string
}

// ProviderResponse is the answer of one provider step.
type ProviderResponse struct {
	Text string
}

// ErrUnsupported marks a request the provider cannot serve in this version;
// the turn fails with reason "unsupported".
var ErrUnsupported = errors.New("unsupported")
