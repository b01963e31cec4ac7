package sim

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/parallel"
)

// The pipeline walk (pipeline.go states its rules): the durations it walks
// with and each pipeline rank's program run against them.

// pipeCosts are the durations walkPipeline walks with.
type pipeCosts struct {
	fwd, bwd []float64 // per stage, one micro-batch, seconds
	rec      []float64 // per stage: the recompute inside bwd
	wgt      []float64 // per stage: the backward-weight ops inside bwd
	msg      func(from, to int) float64
	coll     func(o parallel.ScheduleOp) float64
	opt      []float64 // per pp rank: optimizer step

	// tpFwd and tpBwd are the tensor-parallel collectives inside fwd and
	// bwd, per stage and collective kind (tpKinds).
	tpFwd, tpBwd []tpSeconds
	// inp and tpInp, set under async TP with a zero-bubble schedule, are
	// the backward-input pass walked on its own (asyncPasses), per stage;
	// nil: the input pass is bwd − wgt and holds tpBwd.
	inp   []float64
	tpInp []tpSeconds
	// cpFwd and cpBwd are the CP exchanges inside fwd and bwd per stage
	// (pipeline_cp.go); nil without CP.
	cpFwd, cpBwd []cpCharge
}

// tpSeconds are tensor-parallel collectives' seconds by kind (tpKinds):
// those the computation waits for (exposed), and how long they ran
// (overlapped or not; equal to exposed but under async TP).
type tpSeconds struct{ exposed, ran [len(tpKinds)]float64 }

// add adds t seconds of a collective of kind k that the computation waits
// for in full.
func (x *tpSeconds) add(k int, t float64) {
	x.exposed[k] += t
	x.ran[k] += t
}

// compute is the duration of compute op o and the recompute inside it.
func (c pipeCosts) compute(o parallel.PipeOp) (d, rec float64) {
	s := o.Stage
	switch {
	case o.Kind == parallel.PipeForward:
		return c.fwd[s], 0
	case o.Kind == parallel.PipeBackward, s == 0 && o.Kind == parallel.PipeWeight:
		return c.bwd[s], c.rec[s]
	case s == 0: // the first stage's input pass does nothing
		return 0, 0
	case o.Kind == parallel.PipeInput && c.inp != nil:
		return c.inp[s], c.rec[s]
	case o.Kind == parallel.PipeInput:
		return c.bwd[s] - c.wgt[s], c.rec[s]
	}
	return c.wgt[s], 0
}

// tpIn is the tensor-parallel collectives' seconds inside op o by kind
// (tpKinds), nil for none: a forward's, and a backward's wherever its
// backward-data runs (a full backward, an input pass, stage 0's weight
// pass, as compute prices them).
func (c pipeCosts) tpIn(o parallel.PipeOp) *tpSeconds {
	if c.tpFwd == nil {
		return nil
	}
	s := o.Stage
	switch {
	case o.Kind == parallel.PipeForward:
		return &c.tpFwd[s]
	case s > 0 && o.Kind == parallel.PipeInput && c.tpInp != nil:
		return &c.tpInp[s]
	case o.Kind == parallel.PipeBackward, s == 0 && o.Kind == parallel.PipeWeight, s > 0 && o.Kind == parallel.PipeInput:
		return &c.tpBwd[s]
	}
	return nil
}

// pipeSpan is one op as the walk ran it.
type pipeSpan struct {
	op         parallel.PipeOp
	start, end float64
	comm       bool // on the communication stream (collectives) or a message in flight (send)
}

// tpKinds are the kinds of tensor-parallel collectives, in the order
// pipeCosts and pipeRank keep their seconds.
var tpKinds = [...]parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce}

func tpKind(k parallel.CollKind) int {
	for i, x := range tpKinds {
		if x == k {
			return i
		}
	}
	return len(tpKinds) - 1
}

// pipeRank is one pipeline rank's walk.
type pipeRank struct {
	spans     []pipeSpan
	busy      float64 // forward + backward seconds
	recompute float64 // inside busy
	// tp is the tensor-parallel collectives' seconds on the compute stream
	// by kind (tpKinds): inside busy but for the gradient all-reduces,
	// which run between backwards; tpRan how long they ran (more under
	// async TP, whose overlapped parts run beside the compute).
	tp, tpRan [len(tpKinds)]float64
	tpOutside float64  // the part of tp outside busy
	cp        cpCharge // the CP exchanges inside busy
	gatherOn  float64  // seconds compute waited for FSDP gathers
	computeAt float64  // when its last compute op ended
	commAt    float64  // when its communication stream went idle
	optS      float64
	end       float64 // after the optimizer
}

// pipeWalk is the walked step.
type pipeWalk struct {
	ranks []pipeRank
	step  float64
}

type pipeMsg struct {
	from, to, micro int
	grad            bool
}

// walkPipeline runs p's programs against c (see above).
func walkPipeline(p *parallel.Pipeline, c pipeCosts) (pipeWalk, error) {
	n := len(p.Ranks)
	w := pipeWalk{ranks: make([]pipeRank, n)}
	arrive := map[pipeMsg]float64{}
	next := make([]int, n)
	clock := make([]float64, n) // compute stream
	comm := make([]float64, n)  // communication stream
	// gathers: the gathers issued for the stage about to run its first
	// forward: the first one's end and the last one's.
	type pending struct{ first, last float64 }
	gathers := make([]pending, n)
	for left := 0; ; {
		left = 0
		progress := false
		for r := range n {
			ops := p.Ranks[r]
		run:
			for next[r] < len(ops) {
				o := ops[next[r]]
				wr := &w.ranks[r]
				switch o.Kind {
				case parallel.PipeRecv:
					t, ok := arrive[pipeMsg{o.Peer, o.Stage, o.Micro, o.Grad}]
					if !ok {
						break run
					}
					clock[r] = math.Max(clock[r], t)
				case parallel.PipeSend:
					d := c.msg(o.Stage, o.Peer)
					arrive[pipeMsg{o.Stage, o.Peer, o.Micro, o.Grad}] = clock[r] + d
					wr.spans = append(wr.spans, pipeSpan{op: o, start: clock[r], end: clock[r] + d, comm: true})
				case parallel.PipeColl:
					if o.Coll.Axis == parallel.AxisTP {
						d := c.coll(o.Coll)
						wr.spans = append(wr.spans, pipeSpan{op: o, start: clock[r], end: clock[r] + d, comm: true})
						clock[r] += d
						wr.tp[tpKind(o.Coll.Coll)] += d
						wr.tpRan[tpKind(o.Coll.Coll)] += d
						wr.tpOutside += d
						break
					}
					start := math.Max(comm[r], clock[r])
					comm[r] = start + c.coll(o.Coll)
					if o.Coll.Purpose == parallel.PurposeGather {
						if gathers[r].first == 0 {
							gathers[r].first = comm[r]
						}
						gathers[r].last = comm[r]
					}
					wr.spans = append(wr.spans, pipeSpan{op: o, start: start, end: comm[r], comm: true})
				case parallel.PipeForward, parallel.PipeBackward, parallel.PipeInput, parallel.PipeWeight:
					d, rec := c.compute(o)
					wr.recompute += rec
					if tp := c.tpIn(o); tp != nil {
						for k := range tpKinds {
							wr.tp[k] += tp.exposed[k]
							wr.tpRan[k] += tp.ran[k]
						}
					}
					if cp := c.cpIn(o); cp != nil {
						wr.cp.add(*cp)
					}
					start, end := clock[r], clock[r]+d
					if g := gathers[r]; g.last > 0 {
						start = math.Max(start, g.first)
						end = math.Max(start+d, g.last)
						wr.gatherOn += (end - start) - d
						gathers[r] = pending{}
					}
					wr.busy += d
					wr.spans = append(wr.spans, pipeSpan{op: o, start: start, end: end})
					clock[r] = end
				}
				next[r]++
				progress = true
			}
			left += len(ops) - next[r]
		}
		if left == 0 {
			break
		}
		if !progress {
			return pipeWalk{}, fmt.Errorf("sim: pipeline deadlock with %d ops left (next ops %v)", left, next)
		}
	}
	for r := range n {
		wr := &w.ranks[r]
		wr.computeAt, wr.commAt = clock[r], comm[r]
		wr.optS = c.opt[r]
		wr.end = math.Max(clock[r], comm[r]) + c.opt[r]
		w.step = math.Max(w.step, wr.end)
	}
	return w, nil
}
