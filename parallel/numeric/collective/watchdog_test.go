package collective

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moescope/moescope/parallel"
)

// TestWatchdogStalledRank (fake clock): rank 1 computes without finishing
// an op while rank 0 waits for it in a barrier. The watchdog names rank 1
// at exactly half the collective timeout, before rank 0's wait times out,
// and rank 0 is cancelled with that diagnosis.
func TestWatchdogStalledRank(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testComm(t, 2, 1, 8)
		c.Timeout = 10 * time.Second
		start := time.Now()
		errs := make([]error, 2)
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			if ep.Rank() == 1 {
				<-ctx.Done() // stuck in compute; only a cancellation reaches it
				errs[1] = context.Cause(ctx)
				return errs[1]
			}
			errs[0] = ep.Barrier(ctx, c.Mesh().Group(parallel.AxisShard, ep.Rank()))
			return errs[0]
		})
		var se *StallError
		if !errors.As(err, &se) || se.Rank != 1 || se.Silent != 5*time.Second || se.Timeout != 10*time.Second {
			t.Fatalf("Run = %v, want rank 1 stalled for 5s of a 10s timeout", err)
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Errorf("detected after %v, want 5s", d)
		}
		var ce *Error
		if errors.As(err, &ce) {
			t.Errorf("the barrier timed out before the watchdog spoke: %v", err)
		}
		for r, e := range errs {
			if !errors.As(e, &se) || se.Rank != 1 {
				t.Errorf("rank %d: %v, want the stall of rank 1", r, e)
			}
		}
	})
}

// TestWatchdogLoneRank (fake clock): one rank stuck in compute has no
// peer whose collective could time out; the watchdog still stops it. A
// rank that keeps finishing ops is left alone however long it runs.
func TestWatchdogLoneRank(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testComm(t, 1, 1, 8)
		c.Timeout = 2 * time.Second
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			<-ctx.Done()
			return ctx.Err() // without the cause: Run keeps the diagnosis
		})
		var se *StallError
		if !errors.As(err, &se) || se.Rank != 0 || !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want rank 0 stalled", err)
		}
		err = c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			for range 100 { // 100 s of ops of 0.9 s each
				select {
				case <-time.After(900 * time.Millisecond):
					ep.Beat()
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("a rank finishing an op every 0.9 s of a 2 s timeout was stopped: %v", err)
		}
	})
}
