// Package docs holds promptline's documentation as Markdown. Its only Go is
// a test that keeps the code and design.md in step: every invariant number
// and crash window a comment cites must be defined in design.md, every
// crash point of internal/faults must appear there, and every test it
// names must exist.
package docs
