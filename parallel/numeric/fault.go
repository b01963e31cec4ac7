package numeric

import (
	"context"
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// Fault is an injected rank fault: a testing aid that exercises the
// failure paths (moescope train --fail-rank, --stall-rank).
type Fault struct {
	Rank  int // the rank that fails or stalls
	Step  int // the optimizer step it strikes in (StepIndex before that step, 0-based)
	Micro int // the micro-step of that step
	// Stall false: the rank returns ErrInjectedFault at the start of the
	// micro-step. Stall true: it stops making progress at the
	// micro-step's first op, as a rank stuck in a kernel would, until the
	// watchdog (or a peer's error) cancels the run.
	Stall bool
}

// ErrInjectedFault is the error a Fault without Stall returns.
var ErrInjectedFault = errors.New("injected fault")

// SetFault arms f for the coming steps (nil disarms). Rank, Step and Micro
// must name a rank of the mesh, a step not yet taken and a micro-step of
// the batch.
func (n *Trainer) SetFault(f *Fault) error {
	if f != nil {
		world, micro := len(n.ranks), n.spec.Batch.GradAccum
		switch {
		case f.Rank < 0 || f.Rank >= world:
			return fmt.Errorf("fault rank %d: must be in [0, %d] (the world has %d ranks)", f.Rank, world-1, world)
		case f.Step < n.step:
			return fmt.Errorf("fault step %d: must be ≥ %d (steps taken)", f.Step, n.step)
		case f.Micro < 0 || f.Micro >= micro:
			return fmt.Errorf("fault micro-step %d: must be in [0, %d]", f.Micro, micro-1)
		}
	}
	n.fault = f
	return nil
}

// strikes reports whether f strikes rank at (step, micro).
func (f *Fault) strikes(rank, step, micro int) bool {
	return f != nil && f.Rank == rank && f.Step == step && f.Micro == micro
}

// cancelled carries a rank's cancellation out of the reference's ops. The
// ops of package moe/ref return no errors (they are pure kernels), so the
// recorder they report to panics with this value between two ops once the
// rank's context is done, and runStep recovers it into the rank's error:
// a rank stuck in compute stops at its next op, not at the end of its
// block. (encoding/json unwinds its decoder the same way.)
type cancelled struct{ err error }

// runStep is trainStep with a cancellation raised between two ops turned
// back into the rank's error; any other panic goes on.
func (r *numRank) runStep(ctx context.Context, ep *collective.Endpoint, t int) (ls []float64, err error) {
	r.rec.bind(ctx, ep)
	defer func() {
		r.rec.bind(nil, nil)
		if p := recover(); p != nil {
			c, ok := p.(cancelled)
			if !ok {
				panic(p)
			}
			ls, err = nil, c.err
		}
	}()
	return r.trainStep(ctx, ep, t)
}

// bind attaches the recorder to a step's context and endpoint (nil, nil:
// outside a step, where ops are neither watched nor cancelled).
func (r *rankRecorder) bind(ctx context.Context, ep *collective.Endpoint) {
	r.ctx, r.ep, r.stall = ctx, ep, false
}

// RecordOp implements moe.Recorder. Op counts are the flops package's
// business; here an op that ended is progress for the watchdog, the place
// an injected stall stops, and the point where a cancelled rank stops.
func (r *rankRecorder) RecordOp(o moe.OpRecord) {
	if r.ep == nil {
		return
	}
	r.ep.Beat()
	if r.stall {
		<-r.ctx.Done()
	}
	if r.ctx.Err() != nil {
		panic(cancelled{fmt.Errorf("cancelled in compute after layer %d %s %s: %w", o.Layer, o.Op, o.Pass, context.Cause(r.ctx))})
	}
}
