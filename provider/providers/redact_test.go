package providers_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

// TestProviderErrorsHideURLSecrets: a provider's error is stored with the
// attempt and the failed turn, published in turn.failed and logged; the
// URL it names (net/http's *url.Error) carries no password or query secret.
func TestProviderErrorsHideURLSecrets(t *testing.T) {
	t.Parallel()
	cfg := &providers.HTTPConfig{URL: "http://u:hunter2@127.0.0.1:1/v1/step?token=t0ken"}
	require.NoError(t, cfg.Validate())
	_, err := providers.NewHTTP(http.DefaultClient, cfg).Complete(context.Background(), provider.Request{AttemptID: "a1", SessionID: "s"})
	require.Error(t, err)
	require.ErrorIs(t, err, provider.ErrNotSent, "the class survives the redaction")
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "t0ken")
	require.Contains(t, err.Error(), "token=****")

	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("provider", slog.Any("config", *cfg))
	for _, printed := range []string{fmt.Sprint(*cfg), fmt.Sprintf("%#v", *cfg), logged.String()} {
		require.NotContains(t, printed, "hunter2")
		require.NotContains(t, printed, "t0ken")
	}

	bad := &providers.HTTPConfig{URL: "ftp://u:hunter2@h/x?token=t0ken"}
	err = bad.Validate()
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "t0ken")
}

// TestProviderStatusError: a non-2xx answer is a *provider.StatusError, so
// that logs at the default level can name its status without its body
// (which often echoes the prompt).
func TestProviderStatusError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "bad request: the prompt was ...", http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	cfg := &providers.HTTPConfig{URL: srv.URL}
	require.NoError(t, cfg.Validate())
	_, err := providers.NewHTTP(srv.Client(), cfg).Complete(context.Background(), provider.Request{AttemptID: "a1", SessionID: "s"})
	var se *provider.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusBadRequest, se.Code)
	require.ErrorIs(t, err, provider.ErrRejected)
}
