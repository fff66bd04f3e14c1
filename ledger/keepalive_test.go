package ledger_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// syncBuffer is a log sink that KeepAlive's goroutine and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// KeepAlive warns about a renewal that failed for a reason other than the
// fence, and only then: an operator reads the warning as a database in
// trouble.
func TestKeepAliveWarnsOnlyOnFailedRenewals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	logs := &syncBuffer{}
	renewed := make(chan struct{}, 16)
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease:         300 * time.Millisecond,
		OwnerID:       "owner-a",
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
		OnRenewedFunc: func() { renewed <- struct{}{} },
	})
	_, err := pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('s')`)
	require.NoError(t, err)
	x, err := claims.Acquire(ctx, "s", "e1", nil)
	require.NoError(t, err)

	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); x.KeepAlive(kctx) }()
	t.Cleanup(func() { cancel(); <-done })

	for range 2 {
		select {
		case <-renewed:
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal")
		}
	}
	require.NotContains(t, logs.String(), "renewing claim failed", "a successful renewal is not a failure")

	pool.Close() // every later renewal fails, and not because of the fence
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "renewing claim failed") },
		10*time.Second, 20*time.Millisecond)
}
