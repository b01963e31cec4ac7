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

// Engine streams: FSDP2 issues all-gathers and gradient reductions on two
// side streams; compute (and torchtitan's expert-parallel all-to-all, which
// runs inline) on the default stream.
const (
	simCompute simStream = iota
	simGather
	simReduce
	numSimStreams
)

var simStreamNames = [...]string{"compute", "comm.all_gather", "comm.reduce"}

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
}

// simSpan is when an op ran.
type simSpan struct{ start, end float64 }

// runEngine executes ops and returns each op's span. It fails on a
// dependency cycle or a dependency on a later op of the same stream that
// can never run (a malformed schedule).
func runEngine(ops []simOp) ([]simSpan, error) {
	n := len(ops)
	spans := make([]simSpan, n)
	done := make([]bool, n)
	started := make([]bool, n)
	queues := [numSimStreams][]int{}
	for i, o := range ops {
		if int(o.stream) >= int(numSimStreams) {
			return nil, fmt.Errorf("sim: op %d on unknown stream %d", i, o.stream)
		}
		for _, d := range o.deps {
			if d < 0 || d >= n || d == i {
				return nil, fmt.Errorf("sim: op %d depends on %d (out of range)", i, d)
			}
		}
		queues[o.stream] = append(queues[o.stream], i)
	}
	var head [numSimStreams]int
	busy := [numSimStreams]int{-1, -1, -1}
	// Active collective state.
	type flow struct {
		op        int
		latEnd    float64 // when the latency phase ends
		remaining float64 // bandwidth work left, seconds at full rate
	}
	var flows []flow
	now := 0.0
	finished := 0
	ready := func(i int) bool {
		for _, d := range ops[i].deps {
			if !done[d] {
				return false
			}
		}
		return true
	}
	finish := func(i int) {
		done[i] = true
		spans[i].end = now
		busy[ops[i].stream] = -1
		finished++
	}
	for finished < n {
		// Start every op that can start now.
		for progress := true; progress; {
			progress = false
			for s := range numSimStreams {
				if busy[s] >= 0 || head[s] >= len(queues[s]) {
					continue
				}
				i := queues[s][head[s]]
				if !ready(i) {
					continue
				}
				head[s]++
				busy[s] = i
				started[i] = true
				spans[i].start = now
				if ops[i].coll {
					if ops[i].lat == 0 && ops[i].work == 0 {
						finish(i)
						progress = true
						continue
					}
					flows = append(flows, flow{op: i, latEnd: now + ops[i].lat, remaining: ops[i].work})
				} else if ops[i].compute <= 0 {
					finish(i)
					progress = true
				}
			}
		}
		if finished == n {
			break
		}
		// Next event: a compute op ending, a latency phase ending, or a
		// flow draining at its current share.
		var share [hw.NumLinkClasses]int
		for _, f := range flows {
			if now >= f.latEnd {
				share[ops[f.op].link]++
			}
		}
		next := math.Inf(1)
		for s := range numSimStreams {
			if i := busy[s]; i >= 0 && !ops[i].coll {
				next = math.Min(next, spans[i].start+ops[i].compute)
			}
		}
		for _, f := range flows {
			if now < f.latEnd {
				next = math.Min(next, f.latEnd)
			} else {
				next = math.Min(next, now+f.remaining*float64(share[ops[f.op].link]))
			}
		}
		if math.IsInf(next, 1) {
			return nil, fmt.Errorf("sim: deadlock at t = %g s with %d of %d ops done (a dependency cycle in the schedule)", now, finished, n)
		}
		dt := next - now
		for k := range flows {
			f := &flows[k]
			if now >= f.latEnd {
				f.remaining -= dt / float64(share[ops[f.op].link])
			}
		}
		now = next
		// Retire what ended.
		for s := range numSimStreams {
			if i := busy[s]; i >= 0 && !ops[i].coll && spans[i].start+ops[i].compute <= now {
				finish(i)
			}
		}
		// A flow is done when its work is spent, or when what is left
		// cannot move the clock: below half an ulp of now, now + left
		// rounds to now (late in a long step, 1e-15 s of work is such a
		// remainder), and it would be retried forever.
		var shareNow [hw.NumLinkClasses]int
		for _, f := range flows {
			if now >= f.latEnd {
				shareNow[ops[f.op].link]++
			}
		}
		kept := flows[:0]
		for _, f := range flows {
			if now >= f.latEnd && (f.remaining <= 1e-15*math.Max(1, ops[f.op].work) ||
				now+f.remaining*float64(shareNow[ops[f.op].link]) == now) {
				finish(f.op)
				continue
			}
			kept = append(kept, f)
		}
		flows = kept
	}
	return spans, nil
}
