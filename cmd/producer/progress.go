package main

import (
	"fmt"
	"io"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
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
		return newBarProgress(w, total)
	}
	return &lineProgress{w: w, total: total, last: time.Now()}
}

const progressEvery = 2 * time.Second

// barProgress is drawn with mpb, the library `consumer replay` draws its
// per-partition bars with: one progress-bar library in the module.
type barProgress struct {
	p   *mpb.Progress
	bar *mpb.Bar
}

func newBarProgress(w io.Writer, total int) *barProgress {
	p := mpb.New(mpb.WithOutput(w), mpb.WithWidth(30), mpb.WithRefreshRate(100*time.Millisecond), mpb.WithAutoRefresh())
	bar := p.AddBar(int64(total),
		mpb.PrependDecorators(decor.Name("sending "), decor.CountersNoUnit("%d/%d prompts ")),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.AverageSpeed(nil, " %.0f prompts/s")),
		mpb.BarRemoveOnComplete())
	return &barProgress{p: p, bar: bar}
}

func (b *barProgress) Add(n int) { b.bar.IncrBy(n) }

// Finish stops the bar, also when fewer prompts than the total were
// acknowledged (a send that failed part-way), and waits until it is drawn.
func (b *barProgress) Finish() {
	if !b.bar.Completed() {
		b.bar.Abort(false)
	}
	b.p.Wait()
}

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
