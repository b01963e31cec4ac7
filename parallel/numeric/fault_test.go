package numeric

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/parallel"
)

// faultTrainer is the tiny MoE on gpus ranks (rep replicas, ep) at lbs 1 ×
// seq 4 with micro micro-steps and the given collective timeout.
func faultTrainer(t testing.TB, gpus, rep, ep, micro int, timeout time.Duration) *Trainer {
	t.Helper()
	cfg := moetest.TinyMoE()
	l := moetest.FSDPLayout(t, gpus, rep, ep)
	m, err := parallel.NewMesh(l, cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	init, _ := moe.NewModel[float32](cfg)
	init.InitRandom(1)
	n, err := New(Spec{Config: cfg, Mesh: m, AC: moe.AC{Mode: moe.ACSelective}, Timeout: timeout,
		Batch: parallel.Batch{LBS: 1, Seq: 4, Micro: micro, DP: l.DP()}, AdamW: moe.DefaultAdamW, AuxCoef: cfg.AuxLossCoef}, init.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// stepBounded runs one Step and fails the test, instead of hanging it, if
// the step has not returned by the deadline (far above what it needs).
func stepBounded(t *testing.T, n *Trainer, deadline time.Duration) (StepResult, error) {
	t.Helper()
	type out struct {
		res StepResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := n.Step(context.Background())
		done <- out{res, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(deadline):
		t.Fatalf("Step has not returned after %v: hung", deadline)
		return StepResult{}, nil
	}
}

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
		var ce *CollectiveError
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
					ep.beat()
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

// TestTrainerStallDetected: rank 1 stops at the first op of step 2's
// forward (after a good step 1) while the others go on to their next
// gather. The watchdog names rank 1 within the collective timeout, every
// rank stops with that error, the stalled one between two ops of the
// reference, and nothing hangs.
func TestTrainerStallDetected(t *testing.T) {
	const timeout = 4 * time.Second
	n := faultTrainer(t, 4, 2, 2, 1, timeout)
	if err := n.SetFault(&Fault{Rank: 1, Step: 1, Stall: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := stepBounded(t, n, 5*time.Minute); err != nil {
		t.Fatalf("step 1 (before the stall): %v", err)
	}
	_, err := stepBounded(t, n, 5*time.Minute)
	var se *StallError
	if !errors.As(err, &se) || se.Rank != 1 {
		t.Fatalf("Step = %v, want the watchdog's stall of rank 1", err)
	}
	if se.Silent < timeout/2 || se.Silent >= timeout {
		t.Errorf("detected after %v silent, want in [%v, %v)", se.Silent, timeout/2, timeout)
	}
	for r, e := range n.RankErrors() {
		if !errors.As(e, &se) || se.Rank != 1 {
			t.Errorf("rank %d: %v, want rank 1's stall as its cause", r, e)
		}
	}
	if e := n.RankErrors()[1]; !strings.Contains(e.Error(), "cancelled in compute after layer -1") {
		t.Errorf("rank 1 did not stop between ops of its embedding: %v", e)
	}
}

// TestSetFaultRanges: a fault must name a rank of the mesh, a step not yet
// taken and a micro-step of the batch; each refusal names the range.
func TestSetFaultRanges(t *testing.T) {
	n := faultTrainer(t, 2, 1, 1, 2, 0)
	for _, c := range []struct {
		f    Fault
		want string
	}{
		{Fault{Rank: 2}, "fault rank 2: must be in [0, 1]"},
		{Fault{Rank: -1}, "fault rank -1: must be in [0, 1]"},
		{Fault{Step: -1}, "fault step -1: must be ≥ 0"},
		{Fault{Micro: 2}, "fault micro-step 2: must be in [0, 1]"},
	} {
		if err := n.SetFault(&c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
	if err := n.SetFault(nil); err != nil {
		t.Error(err)
	}
}
