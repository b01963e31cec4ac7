package numeric

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
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
	init, _ := ref.NewModel[float32](cfg)
	init.InitRandom(1)
	n, err := New(Spec{Spec: job.Spec{Model: cfg, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: micro}}, Mesh: m, Timeout: timeout, AdamW: ref.DefaultAdamW, AuxCoef: cfg.AuxLossCoef}, init.Tensors())
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
	var se *collective.StallError
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
