package recovery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The defaults a zero Config gets, as Config's comments state them.
func TestNewDefaults(t *testing.T) {
	t.Parallel()
	r := New(nil, &Config{})
	require.Equal(t, 10*time.Second, r.cfg.Interval)
	require.Equal(t, 100, r.cfg.Batch)
	require.Equal(t, 30*time.Second, r.cfg.RedriveAfter)
	require.Equal(t, "recovery", r.cfg.OwnerID)
	require.NotNil(t, r.log)
}
