package admission

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClassify is admission's rule for a prompt whose ID is stored, case by
// case: any difference of kind or payload is a conflict that arms nothing;
// an exact retry arms the wake only when it asks to be resumed and the
// input neither has a wake pending nor has been promoted.
func TestClassify(t *testing.T) {
	t.Parallel()
	h, other := []byte{1, 2, 3}, []byte{1, 2, 4}
	prompt := func(armed, promoted bool) Stored {
		return Stored{Hash: h, Armed: armed, Promoted: promoted, Kind: KindPrompt}
	}
	for _, tc := range []struct {
		name    string
		stored  Stored
		hash    []byte
		resumes bool
		want    Outcome
		arm     bool
	}{
		{"ExactRetryResumes", prompt(false, false), h, true, Duplicate, true},
		{"ExactRetryWithoutResume", prompt(false, false), h, false, Duplicate, false},
		{"WakePendingAlready", prompt(true, false), h, true, Duplicate, false},
		{"PromotedAlready", prompt(false, true), h, true, Duplicate, false},
		{"OtherPayload", prompt(false, false), other, true, Conflict, false},
		{"ContinuationHoldsTheID", Stored{Hash: h, Kind: KindContinuation}, h, true, Conflict, false},
		{"PermissionReplyHoldsTheID", Stored{Hash: h, Kind: KindPermissionReply}, h, true, Conflict, false},
		{"NothingKnown", Stored{}, h, true, Conflict, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, arm := Classify(tc.stored, tc.hash, tc.resumes)
			require.Equal(t, tc.want, o)
			require.Equal(t, tc.arm, arm)
		})
	}
}
