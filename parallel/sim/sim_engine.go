package sim

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/parallel/hw"
)

// The virtual-time engine: one rank's schedule walked against modelled
// durations. It knows nothing of models or devices: each op arrives with
// its stream, its dependencies and its cost (a compute duration, or a
// collective's latency and bandwidth term on a link class).
//
// Rules (the Schedule's, plus link sharing):
//   - ops of one stream start in list order, each after the previous op of
//     that stream has finished and after every op in its deps;
//   - a compute op runs for its duration;
//   - a collective first pays its latency, then moves its bytes: its
//     bandwidth term is work on its link class, and all collectives of the
//     rank in their bandwidth phase on the same link class share it
//     equally (processor sharing — two concurrent gathers each get half the
//     bus bandwidth).

// simStream identifies an engine stream.
type simStream uint8

// Engine streams: FSDP2 issues all-gathers, gradient reduce-scatters and,
// under HSDP, the replicas' all-reduce on three side streams
// (all_gather_stream, reduce_scatter_stream, all_reduce_stream: pytorch
// 010ae4a8 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
// foreach_reduce runs the all-reduce on its own stream after waiting for
// the reduce-scatter, so the next unit's reduce-scatter does not queue
// behind it); compute (and torchtitan's expert-parallel all-to-all, which
// runs inline) on the default stream.
const (
	simCompute simStream = iota
	simGather
	simReduce
	simAllReduce
	numSimStreams
)

var simStreamNames = [...]string{"compute", "comm.all_gather", "comm.reduce", "comm.all_reduce"}

func (s simStream) String() string { return simStreamNames[s] }

// simOp is one op as the engine sees it.
type simOp struct {
	stream  simStream
	deps    []int
	compute float64 // seconds, compute ops
	coll    bool
	lat     float64      // collectives: latency term, seconds
	work    float64      // collectives: bandwidth term at full link rate, seconds
	link    hw.LinkClass // collectives: bottleneck link class
	side    bool         // collectives: on a communication stream, beside compute
}

// simSpan is when an op ran.
type simSpan struct{ start, end float64 }

// runEngine executes ops and returns each op's span. It fails on a
// dependency cycle or a dependency on a later op of the same stream that
// can never run (a malformed schedule).
func runEngine(ops []simOp) ([]simSpan, error) { return runEngineShared(ops, 1) }

// runEngineShared is runEngine where compute runs at rate (of its
// modelled speed, in (0, 1]) while a side-stream collective moves bytes:
// the SMs NCCL's kernel holds are not computing.
func runEngineShared(ops []simOp, rate float64) ([]simSpan, error) {
	e, err := newEngine(ops)
	if err == nil && rate > 0 && rate < 1 {
		e.rate = rate
	}
	if err != nil {
		return nil, err
	}
	n := len(ops)
	for e.finished < n {
		e.startReady()
		if e.finished == n {
			break
		}
		share := e.bandwidthShares()
		next := e.nextEvent(share)
		if math.IsInf(next, 1) {
			return nil, fmt.Errorf("sim: deadlock at t = %g s with %d of %d ops done (a dependency cycle in the schedule)", e.now, e.finished, n)
		}
		e.advanceTo(next, share)
		e.retireCompute()
		e.retireFlows()
	}
	return e.spans, nil
}

// flow is a collective in flight.
type flow struct {
	op        int
	latEnd    float64 // when the latency phase ends
	remaining float64 // bandwidth work left, seconds at full rate
}

// engine is the state of one runEngine walk.
type engine struct {
	ops      []simOp
	spans    []simSpan
	done     []bool
	queues   [numSimStreams][]int // each stream's ops, in list order
	head     [numSimStreams]int   // each stream's next op to start, in queues
	busy     [numSimStreams]int   // each stream's running op; -1 when idle
	flows    []flow
	now      float64
	finished int
	left     [numSimStreams]float64 // each stream's running compute op: work left, seconds at full rate
	rate     float64                // compute rate while a side collective moves bytes
}

// newEngine checks every op's stream and dependencies and queues the ops
// by stream.
func newEngine(ops []simOp) (*engine, error) {
	n := len(ops)
	e := &engine{ops: ops, spans: make([]simSpan, n), done: make([]bool, n), rate: 1}
	for s := range e.busy {
		e.busy[s] = -1 // idle
	}
	var per [numSimStreams]int // each stream's queue made once, at its length
	for i, o := range ops {
		if int(o.stream) >= int(numSimStreams) {
			return nil, fmt.Errorf("sim: op %d on unknown stream %d", i, o.stream)
		}
		for _, d := range o.deps {
			if d < 0 || d >= n || d == i {
				return nil, fmt.Errorf("sim: op %d depends on %d (out of range)", i, d)
			}
		}
		per[o.stream]++
	}
	for st, k := range per {
		e.queues[st] = make([]int, 0, k)
	}
	for i, o := range ops {
		e.queues[o.stream] = append(e.queues[o.stream], i)
	}
	return e, nil
}

// ready reports whether every dependency of op i is done.
func (e *engine) ready(i int) bool {
	for _, d := range e.ops[i].deps {
		if !e.done[d] {
			return false
		}
	}
	return true
}

// finish ends op i now and frees its stream.
func (e *engine) finish(i int) {
	e.done[i] = true
	e.spans[i].end = e.now
	e.busy[e.ops[i].stream] = -1
	e.finished++
}

// startReady starts every op that can start now: the next op of each idle
// stream once its dependencies are done. An op with nothing to do finishes
// as it starts, which may free another, so it repeats until none starts.
func (e *engine) startReady() {
	for progress := true; progress; {
		progress = false
		for s := range numSimStreams {
			if e.busy[s] >= 0 || e.head[s] >= len(e.queues[s]) {
				continue
			}
			i := e.queues[s][e.head[s]]
			if !e.ready(i) {
				continue
			}
			e.head[s]++
			e.busy[s] = i
			e.spans[i].start = e.now
			o := e.ops[i]
			if o.coll {
				if o.lat == 0 && o.work == 0 {
					e.finish(i)
					progress = true
					continue
				}
				e.flows = append(e.flows, flow{op: i, latEnd: e.now + o.lat, remaining: o.work})
			} else if o.compute <= 0 {
				e.finish(i)
				progress = true
			} else {
				e.left[s] = o.compute
			}
		}
	}
}

// bandwidthShares counts, per link class, the flows past their latency
// phase now: each of them moves at 1/count of the link's rate.
func (e *engine) bandwidthShares() [hw.NumLinkClasses]int {
	var share [hw.NumLinkClasses]int
	for _, f := range e.flows {
		if e.now >= f.latEnd {
			share[e.ops[f.op].link]++
		}
	}
	return share
}

// nextEvent returns the time of the next event: a compute op ending, a
// latency phase ending, or a flow draining at its current share.
func (e *engine) nextEvent(share [hw.NumLinkClasses]int) float64 {
	next := math.Inf(1)
	for s := range numSimStreams {
		if i := e.busy[s]; i >= 0 && !e.ops[i].coll {
			next = math.Min(next, e.now+e.left[s]/e.computeRate())
		}
	}
	for _, f := range e.flows {
		if e.now < f.latEnd {
			next = math.Min(next, f.latEnd)
		} else {
			next = math.Min(next, e.now+f.remaining*float64(share[e.ops[f.op].link]))
		}
	}
	return next
}

// advanceTo moves the clock to next, draining each flow in its bandwidth
// phase by its share of the link over the interval.
func (e *engine) advanceTo(next float64, share [hw.NumLinkClasses]int) {
	dt := next - e.now
	r := e.computeRate()
	for s := range numSimStreams {
		if i := e.busy[s]; i >= 0 && !e.ops[i].coll {
			e.left[s] -= dt * r
		}
	}
	for k := range e.flows {
		f := &e.flows[k]
		if e.now >= f.latEnd {
			f.remaining -= dt / float64(share[e.ops[f.op].link])
		}
	}
	e.now = next
}

// retireCompute finishes the compute ops that have ended by now.
func (e *engine) retireCompute() {
	for s := range numSimStreams {
		// Work too small to move the clock is done (as retireFlows does).
		if i := e.busy[s]; i >= 0 && !e.ops[i].coll && (e.left[s] <= 1e-12*e.ops[i].compute || e.now+e.left[s]/e.computeRate() == e.now) {
			e.finish(i)
		}
	}
}

// retireFlows finishes the flows that are done. A flow is done when its
// work is spent, or when what is left cannot move the clock: below half an
// ulp of now, now + left rounds to now (late in a long step, 1e-15 s of
// work is such a remainder), and it would be retried forever. Shares are
// counted at the new time, so a flow whose latency phase has just ended
// counts.
func (e *engine) retireFlows() {
	share := e.bandwidthShares()
	kept := e.flows[:0]
	for _, f := range e.flows {
		if e.now >= f.latEnd && (f.remaining <= 1e-15*math.Max(1, e.ops[f.op].work) ||
			e.now+f.remaining*float64(share[e.ops[f.op].link]) == e.now) {
			e.finish(f.op)
			continue
		}
		kept = append(kept, f)
	}
	e.flows = kept
}

// computeRate is the rate compute runs at now: e.rate while a side-stream
// collective is in its bandwidth phase, else 1.
func (e *engine) computeRate() float64 {
	for _, f := range e.flows {
		if e.ops[f.op].side && e.now >= f.latEnd {
			return e.rate
		}
	}
	return 1
}
