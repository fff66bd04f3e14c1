// Package lazylog keeps a logger's attributes unformatted until a record
// is written. slog's JSON and text handlers format the attributes of every
// With at once and keep the result for the logger's life: a few hundred
// bytes per call. The executor gives each execution a logger with its
// session, execution and turn, and at ten thousand turns in flight, each
// waiting on its provider and rarely logging, that was about a kilobyte per
// execution spent on lines never written (docs/benchmarks.md, "memory per
// execution in flight"). The standard library offers no lazy handler and
// no well-kept library does only this; it is one small slog.Handler.
package lazylog

import (
	"context"
	"log/slog"
)

// Handler wraps base: attributes given by WithAttrs are kept as they are
// and handed to base only when a record is handled; groups, rare, are
// handed over at once. What is written is what base alone would write,
// provided base's Enabled and state do not depend on the attributes (it
// is asked Enabled without them, and a handler with them is made afresh
// for each record: a handler that samples or deduplicates per instance
// does not belong under it), and that the attributes' values do not
// change after With: they are read
// (a slog.LogValuer resolved, a slice, map or pointer followed, the
// handler's ReplaceAttr applied) when each record is written, on the
// writer's goroutine, not once at With. Give it strings, numbers and other
// values that do not change; the executor's are session, execution and
// turn IDs and a fencing token.
func Handler(base slog.Handler) slog.Handler {
	if h, ok := base.(*handler); ok {
		return h
	}
	return &handler{base: base}
}

// handler holds what one WithAttrs gave, as given (slog hands the slice
// over: "the Handler owns the slice"), and its parent: a chain, so that a
// child shares its parents' attributes instead of copying them.
type handler struct {
	base   slog.Handler
	parent *handler
	attrs  []slog.Attr
}

func (h *handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.base.Enabled(ctx, level)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	return h.resolved().Handle(ctx, r)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return &handler{base: h.base, parent: h, attrs: attrs}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{base: h.resolved().WithGroup(name)} // an empty name: base returns itself
}

// resolved is base with the chain's attributes, the oldest first.
func (h *handler) resolved() slog.Handler {
	all := h.appendAttrs(nil)
	if len(all) == 0 {
		return h.base
	}
	return h.base.WithAttrs(all)
}

// appendAttrs appends the chain's attributes to all, the parents' first.
func (h *handler) appendAttrs(all []slog.Attr) []slog.Attr {
	if h.parent != nil {
		all = h.parent.appendAttrs(all)
	}
	return append(all, h.attrs...)
}
