package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progressBar draws a one-line progress bar on a terminal; a nil
// *progressBar (what newProgressBar returns when the writer is not a
// terminal) does nothing, so pipes and files never see control characters.
type progressBar struct {
	w     io.Writer
	mu    sync.Mutex
	start time.Time
	last  time.Time
	drawn bool
	// label names what is counted: "" is plan's "stage N … simulated";
	// otherwise "<label> … done/total blocks".
	label string
}

// newProgressBar returns a bar on w when w is a terminal, else nil.
func newProgressBar(w io.Writer) *progressBar {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	now := time.Now()
	return &progressBar{w: w, start: now}
}

// update redraws the bar (at most ten times a second, and at the end of a stage).
func (b *progressBar) update(stage, done, total int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if done < total && now.Sub(b.last) < 100*time.Millisecond {
		return
	}
	b.last = now
	const width = 30
	filled := 0
	if total > 0 {
		filled = width * done / total
	}
	bar := "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]"
	if b.label != "" {
		fmt.Fprintf(b.w, "\r%s %s %d/%d blocks  %.1fs ", b.label, bar, done, total, now.Sub(b.start).Seconds())
	} else {
		fmt.Fprintf(b.w, "\rstage %d %s %d/%d simulated  %.1fs ", stage, bar, done, total, now.Sub(b.start).Seconds())
	}
	b.drawn = true
}

// finish clears the bar's line.
func (b *progressBar) finish() {
	if b == nil || !b.drawn {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", 72))
}
