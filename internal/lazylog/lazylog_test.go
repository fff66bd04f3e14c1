package lazylog_test

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/lazylog"
)

// Whatever the calls, the lazy logger writes what the handler alone
// writes, byte for byte: attributes in order, nested With, groups, record
// attributes, levels below the handler's left out.
func TestWritesWhatTheHandlerWrites(t *testing.T) {
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	cases := map[string]func(l *slog.Logger){
		"plain":       func(l *slog.Logger) { l.Info("m", "k", 1) },
		"with":        func(l *slog.Logger) { l.With("a", "x").Info("m", "k", 1) },
		"nested with": func(l *slog.Logger) { l.With("a", "x").With(slog.Int64("b", 2)).With("c", true).Warn("m") },
		"siblings": func(l *slog.Logger) {
			p := l.With("a", 1)
			p.With("b", 2).Info("one")
			p.With("c", 3).Info("two")
			p.Info("three")
		},
		"group":       func(l *slog.Logger) { l.With("a", 1).WithGroup("g").With("b", 2).Info("m", "c", 3) },
		"empty group": func(l *slog.Logger) { l.With("a", 1).WithGroup("").Info("m") },
		"group value": func(l *slog.Logger) { l.With(slog.Group("g", "x", 1)).Info("m") },
		"below level": func(l *slog.Logger) { l.With("a", 1).Debug("hidden"); l.Info("shown") },
		"error values": func(l *slog.Logger) {
			l.With("e", context.Canceled).Error("m", slog.Any("err", context.DeadlineExceeded))
		},
	}
	for name, logs := range cases {
		t.Run(name, func(t *testing.T) {
			for _, newHandler := range []func(*bytes.Buffer) slog.Handler{
				func(b *bytes.Buffer) slog.Handler {
					return slog.NewJSONHandler(b, &slog.HandlerOptions{ReplaceAttr: noTime})
				},
				func(b *bytes.Buffer) slog.Handler {
					return slog.NewTextHandler(b, &slog.HandlerOptions{ReplaceAttr: noTime})
				},
			} {
				var want, got bytes.Buffer
				logs(slog.New(newHandler(&want)))
				logs(slog.New(lazylog.Handler(newHandler(&got))))
				require.NotEmpty(t, want.String())
				require.Equal(t, want.String(), got.String())
			}
		})
	}
}

func TestEnabledIsTheHandlers(t *testing.T) {
	base := slog.NewJSONHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelWarn})
	h := lazylog.Handler(base).WithAttrs([]slog.Attr{slog.Int("a", 1)})
	require.False(t, h.Enabled(context.Background(), slog.LevelInfo))
	require.True(t, h.Enabled(context.Background(), slog.LevelWarn))
	require.Same(t, lazylog.Handler(h), h, "wrapping twice wraps once")
}

// What a logger with an execution's three attributes keeps, the handler
// alone and lazy: the executor makes one per execution (and keeps its
// parents, one per With) and rarely logs. B-kept/logger is the heap still
// held, the whole chain of each of 10,000 loggers alive, after a GC.
func BenchmarkWith(b *testing.B) {
	for _, v := range []struct {
		name string
		h    slog.Handler
	}{
		{"json", slog.NewJSONHandler(&bytes.Buffer{}, nil)},
		{"lazy-json", lazylog.Handler(slog.NewJSONHandler(&bytes.Buffer{}, nil))},
	} {
		b.Run(v.name, func(b *testing.B) {
			l := slog.New(v.h)
			const n = 10000
			type chain struct{ session, execution, turn *slog.Logger }
			kept := make([]chain, n)
			var before, after runtime.MemStats
			b.ReportAllocs()
			for b.Loop() {
				clear(kept)
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range kept {
					s := l.With(slog.String("session_id", "session-0123456789"))
					x := s.With(slog.String("execution_id", "0193f2a4-6c1e-7d3b-9a55-3f8e2b1c4d5e"), slog.Int64("fencing_token", 42))
					kept[i] = chain{s, x, x.With(slog.String("turn_id", "0193f2a4-6c1e-7d3b-9a55-3f8e2b1c4d5f"))}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B-kept/logger")
			runtime.KeepAlive(kept)
		})
	}
}
