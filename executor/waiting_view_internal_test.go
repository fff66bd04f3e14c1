package executor

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// A session's view read the text of every waiting input, to promote one
// (or the steers): a session with a thousand queued prompts of a megabyte
// had each of its turns read and hold a gigabyte, a thousand times over,
// enough to kill the process at every wake of it (and its partition's
// other sessions with it). The view reads the text of the inputs a turn
// can pick: the steers and the oldest.
func TestViewReadsTheTextOfWhatATurnCanPick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})

	const n, size = 200, 256 << 10
	admit := func(t *testing.T, session string, delivery func(i int) envelope.Delivery) {
		t.Helper()
		for i := 0; i < n; i += 20 {
			var batch []admission.Incoming
			for j := i; j < i+20; j++ {
				batch = append(batch, admission.Incoming{Prompt: envelope.Prompt{
					MessageID: fmt.Sprintf("%s-m%03d", session, j), SessionID: session,
					Text: fmt.Sprintf("%03d", j) + strings.Repeat("x", size), Delivery: delivery(j)}})
			}
			_, err := admitter.Admit(ctx, batch)
			require.NoError(t, err)
		}
	}
	view := func(t *testing.T, session string) (*sessionView, int) {
		t.Helper()
		ex := &execution{e: &Executor{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{})}, sessionID: session}
		start := time.Now()
		v, err := ex.readView(ctx)
		require.NoError(t, err)
		held := 0
		for _, w := range v.waiting {
			held += len(w.text)
		}
		t.Logf("view of %d waiting inputs of %d kB: %d kB of text read in %s", len(v.waiting), size>>10, held>>10, time.Since(start))
		return v, held
	}

	t.Run("Queued", func(t *testing.T) {
		t.Parallel()
		admit(t, "q", func(int) envelope.Delivery { return envelope.DeliveryQueue })
		v, held := view(t, "q")
		require.Equal(t, 1, len(v.waiting), "the head of a queue of prompts: its oldest")
		require.Equal(t, size+3, held, "the text of the oldest alone")
		tt := newTurn(pickTurn(v.waiting))
		require.Len(t, tt.inputs, 1)
		require.Equal(t, "000"+strings.Repeat("x", size), tt.inputs[0].Text)
	})

	t.Run("Steers", func(t *testing.T) {
		t.Parallel()
		admit(t, "s", func(i int) envelope.Delivery {
			if i%50 == 7 {
				return envelope.DeliverySteer
			}
			return envelope.DeliveryQueue
		})
		v, held := view(t, "s")
		require.Equal(t, 5, len(v.waiting), "the head: the oldest and the steers")
		require.Equal(t, 5*(size+3), held, "the steers' and the oldest's")
		tt := newTurn(pickTurn(v.waiting))
		require.Len(t, tt.inputs, 4)
		for i, in := range tt.inputs {
			require.Equal(t, fmt.Sprintf("%03d", 50*i+7)+strings.Repeat("x", size), in.Text)
		}
	})
}

// Every waiting steer joined the next turn: a thousand steers of a
// megabyte were one turn, a request of a gigabyte held three times over
// (the request, its fingerprint, the provider's encoding), and events
// naming a thousand inputs. A turn takes the oldest waiting steers up to
// maxSteersPerTurn and maxSteerBytesPerTurn of text (one at least); the
// others still jump the queue, in the turns right after.
func TestATurnTakesABoundedShareOfTheSteers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})

	admit := func(t *testing.T, session string, n, size int) {
		t.Helper()
		var batch []admission.Incoming
		batch = append(batch, admission.Incoming{Prompt: envelope.Prompt{MessageID: session + "-q", SessionID: session,
			Text: "queued first", Delivery: envelope.DeliveryQueue}})
		for j := range n {
			batch = append(batch, admission.Incoming{Prompt: envelope.Prompt{
				MessageID: fmt.Sprintf("%s-s%04d", session, j), SessionID: session,
				Text: fmt.Sprintf("%04d", j) + strings.Repeat("x", size), Delivery: envelope.DeliverySteer}})
			if len(batch) == 50 {
				_, err := admitter.Admit(ctx, batch)
				require.NoError(t, err)
				batch = nil
			}
		}
		_, err := admitter.Admit(ctx, batch)
		require.NoError(t, err)
	}
	pick := func(t *testing.T, session string) []waitingInput {
		t.Helper()
		v, err := (&execution{e: &Executor{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{})}, sessionID: session}).readView(ctx)
		require.NoError(t, err)
		return pickTurn(v.waiting)
	}
	for _, tc := range []struct {
		name    string
		n, size int
		want    int
	}{
		{name: "ByCount", n: 3 * maxSteersPerTurn, size: 10, want: maxSteersPerTurn},
		{name: "ByBytes", n: 150, size: 16 << 10, want: int(math.Ceil(float64(maxSteerBytesPerTurn) / float64(4+16<<10)))},
		{name: "OneLargerThanTheBound", n: 3, size: maxSteerBytesPerTurn + 1, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := id(t)
			admit(t, s, tc.n, tc.size)
			got := pick(t, s)
			require.Equal(t, tc.want, len(got), "steers in the turn")
			for i, w := range got {
				require.Equal(t, fmt.Sprintf("%s-s%04d", s, i), w.id, "the oldest steers, in order")
				require.Equal(t, fmt.Sprintf("%04d", i)+strings.Repeat("x", tc.size), w.text)
			}
		})
	}
}

func id(t *testing.T) string { return strings.ReplaceAll(t.Name(), "/", "-") }
