package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// TestOperatorCommandsShowTimesThatAreNotATime runs the operator's
// commands as a process on a session whose claim's expires_at and waiting
// input's admitted_at a hand edit set to '-infinity' or 'infinity' (the
// columns admit them): `session show` (text and JSON), then, once
// recovery quarantined the claim and the quarantine's and the decision's
// times were edited too, `quarantine list` and `recovery explain` (text
// and JSON). Each exits 0 and shows the value in words: in the text where
// the time would be, in the JSON in the *_not_finite key beside the time
// (the zero time then), as recovery's evidence has it. Before, each failed on the driver's "cannot scan Infinity
// into *time.Time", for the very session an operator had to look at.
func TestOperatorCommandsShowTimesThatAreNotATime(t *testing.T) {
	const zeroTime = "0001-01-01T00:00:00Z"
	t.Parallel()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, url := testkit.Pool(t)
			db := []string{"--database-url", url}
			_, err := admission.NewAdmitter(pool, &admission.AdmitterConfig{}).Admit(ctx, []admission.Incoming{{
				Prompt: envelope.Prompt{MessageID: "m1", SessionID: "s", Text: "hello", Delivery: envelope.DeliveryQueue}}})
			require.NoError(t, err)
			claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "holder"})
			_, err = claims.AcquireWaiting(ctx, "s", "exec-1", nil)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE claims SET expires_at = $1::timestamptz`, value)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE inputs SET admitted_at = $1::timestamptz`, value)
			require.NoError(t, err)

			out, stderr, code := runOnce(t, append([]string{"session", "show", "s"}, db...)...)
			require.Zero(t, code, "consumer session show: %s", stderr)
			require.Contains(t, out, "  expires            "+value)
			require.Regexp(t, `(?m)^  m1\s+queue\s+#\d+ `+value+`\s`, out)
			out, stderr, code = runOnce(t, append([]string{"session", "show", "s", "--json"}, db...)...)
			require.Zero(t, code, "consumer session show --json: %s", stderr)
			var report struct {
				Claim struct {
					ExpiresAt          string  `json:"expires_at"`
					ExpiresAtNotFinite *string `json:"expires_at_not_finite"`
				} `json:"claim"`
				Inputs []struct {
					AdmittedAt          string  `json:"admitted_at"`
					AdmittedAtNotFinite *string `json:"admitted_at_not_finite"`
				} `json:"inputs"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &report), out)
			require.Equal(t, zeroTime, report.Claim.ExpiresAt, "a time key holds a time")
			require.Equal(t, value, *report.Claim.ExpiresAtNotFinite, "the value beside it")
			require.Equal(t, zeroTime, report.Inputs[0].AdmittedAt)
			require.Equal(t, value, *report.Inputs[0].AdmittedAtNotFinite)

			_, err = recovery.New(pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour}).RunOnce(ctx)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE claims SET quarantined_at = $1::timestamptz`, value)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE recoveries SET decided_at = $1::timestamptz`, value)
			require.NoError(t, err)

			out, stderr, code = runOnce(t, append([]string{"quarantine", "list"}, db...)...)
			require.Zero(t, code, "consumer quarantine list: %s", stderr)
			require.Regexp(t, `(?m)^claim\s+s\s+s\s+`+value+`\s+expires_at is not finite \(`+value+`\)$`, out)
			out, stderr, code = runOnce(t, append([]string{"quarantine", "list", "--json"}, db...)...)
			require.Zero(t, code, "consumer quarantine list --json: %s", stderr)
			require.Contains(t, out, `"quarantined_at":"`+zeroTime+`","quarantined_at_not_finite":"`+value+`"`)

			out, stderr, code = runOnce(t, append([]string{"recovery", "explain", "s"}, db...)...)
			require.Zero(t, code, "consumer recovery explain: %s", stderr)
			require.True(t, strings.Contains(out, value), out)
			require.NotContains(t, out, "0001-01-01")
			out, stderr, code = runOnce(t, append([]string{"recovery", "explain", "s", "--json"}, db...)...)
			require.Zero(t, code, "consumer recovery explain --json: %s", stderr)
			require.Contains(t, out, `"decided_at":"`+zeroTime+`","decided_at_not_finite":"`+value+`"`)
		})
	}
}
