package collective

import (
	"context"
	"fmt"
	"time"
)

// The watchdog finds a rank that has stopped making progress outside the
// collectives. A rank waiting in a collective is the collective timeout's
// business; one stuck in compute (a hung kernel, an injected stall) joins
// no collective and would let its peers time out one by one, or, with no
// peer waiting for it (one rank, or the others finished), hang the run.
// Each rank beats at every op the reference reports (Endpoint.Beat, which
// package numeric's rankRecorder.RecordOp calls) and whenever it leaves a
// collective (while it waits in one it is not watched); a computing rank
// silent for half the collective timeout cancels the run with a
// StallError. Half, so that the watchdog names the stalled rank before
// the collectives its peers joined after its last progress time out (they
// would only say it is missing), and a stall is always detected within the
// collective timeout.

// StallError reports a rank that made no progress for half the collective
// timeout while computing.
type StallError struct {
	Rank    int
	Silent  time.Duration // since its last op or collective
	Timeout time.Duration // the collective timeout in force
}

func (e *StallError) Error() string {
	return fmt.Sprintf("watchdog: rank %d stalled: no op finished and no collective joined for %v (the limit is half the collective timeout %v)", e.Rank, e.Silent.Round(time.Millisecond), e.Timeout)
}

// timeout is the collective timeout in force.
func (c *Comm) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// now is the time since Run started (monotonic).
func (c *Comm) now() time.Duration { return time.Since(c.start) }

// beat records that rank made progress now.
func (c *Comm) beat(rank int) { c.beats[rank].Store(int64(c.now())) }

// Beat records that this endpoint's rank made progress now (an op ended):
// the watchdog's view of a rank that computes outside the collectives.
func (e *Endpoint) Beat() { e.c.beat(e.rank) }

// watch wakes when the earliest computing rank could have been silent for
// half the timeout, and returns the first rank found stalled; nil once ctx is
// done or stop is closed.
func (c *Comm) watch(ctx context.Context, stop <-chan struct{}) *StallError {
	t := time.NewTimer(c.timeout() / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case <-t.C:
		}
		next, stall := c.checkProgress()
		if stall != nil {
			return stall
		}
		t.Reset(next)
	}
}

// checkProgress returns a computing rank (neither waiting in a collective
// nor finished) silent for half the timeout, or else how long until the
// earliest computing rank could be.
func (c *Comm) checkProgress() (time.Duration, *StallError) {
	timeout := c.timeout()
	limit := timeout / 2
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	next := limit
	for r := range c.beats {
		if c.exited[r] || c.waiting[r] != nil {
			continue
		}
		silent := now - time.Duration(c.beats[r].Load())
		if silent >= limit {
			return 0, &StallError{Rank: r, Silent: silent, Timeout: timeout}
		}
		next = min(next, limit-silent)
	}
	return next, nil
}
