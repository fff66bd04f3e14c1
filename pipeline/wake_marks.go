package pipeline

// wakeMarks decides how far a wakes partition's offset may be committed:
// past every wake whose session has gone idle here, up to the first wake
// whose session still runs. Kafka keeps one committed offset a partition,
// so a run that lasts holds it; what must not happen is that it holds the
// partition: the consumer goes on handing wakes over while earlier runs
// go on.
//
// What it keeps is one entry per run still going, at the offset of the
// first wake that joined it (the wakes that joined it later share its
// completion and have later offsets), so it is bounded by the runs of the
// executor, not by the wakes consumed: a session whose prompts keep
// arriving adds one entry, not one per prompt, and the runs that ended
// behind a long one are swept out. The channel-and-goroutine version it
// replaces kept every wake until its turn came, at most 1,024, and then
// stopped reading the partition until the run at its head ended.
//
// It is used by one goroutine (the partition's consumeWakes).
type wakeMarks struct {
	commit func(next int64) // commits next as the partition's next offset to read
	next   int64            // the offset after the last wake added
	done   int64            // the last offset committed (-1: none yet)
	runs   []wakeRun        // by offset; the first may have ended
	seen   map[<-chan struct{}]struct{}
	// sweepAt is the length of runs at which the ended ones are swept out
	// of the middle.
	sweepAt int
}

type wakeRun struct {
	offset int64
	ended  <-chan struct{}
}

const wakeMarksSweepMin = 64

func newWakeMarks(commit func(next int64)) *wakeMarks {
	return &wakeMarks{commit: commit, done: -1, seen: map[<-chan struct{}]struct{}{}, sweepAt: wakeMarksSweepMin}
}

// add records the wake at offset, handed to the run that closes ended when
// its session goes idle (nil: nothing to wait for), and commits what it
// can.
func (w *wakeMarks) add(offset int64, ended <-chan struct{}) {
	w.next = offset + 1
	if ended != nil {
		if _, ok := w.seen[ended]; !ok {
			w.seen[ended] = struct{}{}
			w.runs = append(w.runs, wakeRun{offset: offset, ended: ended})
			if len(w.runs) >= w.sweepAt {
				w.sweep()
			}
		}
	}
	w.mark()
}

// head is the end of the first run still going: nil (never ready in a
// select) when none goes.
func (w *wakeMarks) head() <-chan struct{} {
	if len(w.runs) == 0 {
		return nil
	}
	return w.runs[0].ended
}

// idle says whether every wake added has its session idle (and so is
// committed).
func (w *wakeMarks) idle() bool { return len(w.runs) == 0 }

// mark drops the ended runs at the front and commits up to the first run
// still going, or past the last wake added when none goes.
func (w *wakeMarks) mark() {
	for len(w.runs) > 0 && closed(w.runs[0].ended) {
		delete(w.seen, w.runs[0].ended)
		w.runs[0] = wakeRun{}
		w.runs = w.runs[1:]
	}
	upTo := w.next
	if len(w.runs) > 0 {
		upTo = w.runs[0].offset
	}
	if upTo > w.done {
		w.done = upTo
		w.commit(upTo)
	}
}

// sweep drops the runs that ended behind the first, and sets the next
// sweep at twice what is left, so that sweeping costs O(1) a wake.
func (w *wakeMarks) sweep() {
	kept := w.runs[:0]
	for _, r := range w.runs {
		if closed(r.ended) {
			delete(w.seen, r.ended)
			continue
		}
		kept = append(kept, r)
	}
	clear(w.runs[len(kept):])
	w.runs = kept
	w.sweepAt = max(wakeMarksSweepMin, 2*len(kept))
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
