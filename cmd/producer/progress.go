package main

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress reports how many prompts the brokers have acknowledged.
type progress interface {
	Add(n int)
	Finish()
}

// newProgress draws a bar on a terminal and writes a plain line at most
// once per progressEvery otherwise (logs, pipes, CI).
func newProgress(w io.Writer, total int) progress {
	if isTerminal(w) {
		return barProgress{progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("sending"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("prompts"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)}
	}
	return &lineProgress{w: w, total: total, last: time.Now()}
}

const progressEvery = 2 * time.Second

type barProgress struct{ bar *progressbar.ProgressBar }

func (b barProgress) Add(n int) { _ = b.bar.Add(n) }
func (b barProgress) Finish()   { _ = b.bar.Finish() }

type lineProgress struct {
	w           io.Writer
	total, done int
	last        time.Time
}

func (p *lineProgress) Add(n int) {
	p.done += n
	if now := time.Now(); now.Sub(p.last) >= progressEvery && p.done < p.total {
		p.last = now
		fmt.Fprintf(p.w, "sent %d/%d prompts (%d%%)\n", p.done, p.total, p.done*100/p.total)
	}
}

func (*lineProgress) Finish() {}
