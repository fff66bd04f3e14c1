package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// The bucket's tokens is a float8 whose CHECK (tokens >= 0) admits 'NaN'
// and 'Infinity' (Postgres orders NaN above every number). Neither says
// how many tokens are left: the bucket reads as full, the burst it allows
// after any calm, as it does for an updated_at that is not a time, and the
// take leaves a number again. A paced pass decides and redrives.
func TestBucketTokensThatAreNotANumber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"NaN", "Infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			notFiniteState(t, b)
			b.exec(t, `UPDATE recovery_rate SET tokens = $1::float8, updated_at = clock_timestamp()`, value)
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Rate: 2, Interval: time.Minute})
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions, "decided, not quarantined")
			require.Equal(t, 1, p.Redriven)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_rate WHERE tokens >= 0 AND tokens <= 2`),
				"two tokens taken from a full bucket of two; a number again")
		})
	}
}
