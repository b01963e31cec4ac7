package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// Chrome trace export of a simulated step (the Trace Event Format that
// Perfetto and chrome://tracing open): one process per rank, one thread per
// stream, a complete ("X") event per op with microsecond timestamps, and a
// counter track of the rank's allocated memory from the memory timeline.

type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// WriteTrace writes the step as Chrome trace JSON for the given ranks. The
// result must come from Simulate with KeepTimeline. Ranks run the same
// program (see Simulate's exactness note), so each listed rank shows the
// simulated rank's timeline.
//
// Under pipeline parallelism the trace has one process per pipeline rank
// (one data-parallel rank of each stage) and ranks is ignored: a compute
// thread with the stage's forwards and backwards, a communication thread
// with its FSDP collectives, and its messages in flight on a third.
func (r *Result) WriteTrace(w io.Writer, ranks []int) error {
	if r.pipe != nil {
		return r.writePipelineTrace(w)
	}
	if r.spans == nil || r.Schedule == nil {
		return errors.New("trace: simulate with KeepTimeline to write a trace")
	}
	world := r.Schedule.Layout.GPUs
	for _, rk := range ranks {
		if rk < 0 || rk >= world {
			return fmt.Errorf("trace: rank %d out of range [0, %d)", rk, world)
		}
	}
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString(`{"displayTimeUnit":"ms","traceEvents":[`); err != nil {
		return err
	}
	first := true
	emit := func(e traceEvent) error {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if !first {
			if err := bw.WriteByte(','); err != nil {
				return err
			}
		}
		first = false
		_, err = bw.Write(b)
		return err
	}
	for _, rk := range ranks {
		if err := emit(traceEvent{Name: "process_name", Ph: "M", PID: rk, Args: map[string]any{"name": "rank " + strconv.Itoa(rk)}}); err != nil {
			return err
		}
		for s := range numSimStreams {
			if err := emit(traceEvent{Name: "thread_name", Ph: "M", PID: rk, TID: int(s), Args: map[string]any{"name": s.String()}}); err != nil {
				return err
			}
		}
		for i, o := range r.Schedule.Ops {
			sp := r.spans[i]
			e := traceEvent{Ph: "X", PID: rk, TID: int(r.streams[i]), TS: sp.start * 1e6, Dur: (sp.end - sp.start) * 1e6}
			if o.Type == parallel.OpCompute {
				e.Cat = "compute"
				e.Name = fmt.Sprintf("L%d %s %s", o.Layer, o.Phase, o.Segment)
				e.Args = map[string]any{"micro": o.Micro}
			} else {
				e.Cat = "comm"
				e.Name = fmt.Sprintf("%s %s", o.Coll, o.Purpose)
				e.Args = map[string]any{"micro": o.Micro, "layer": o.Layer, "axis": string(o.Axis), "bytes": o.Bytes()}
				if o.Purpose == parallel.PurposeGather || o.Purpose == parallel.PurposeGradReduce || o.Purpose == parallel.PurposeGradReplica || o.Purpose == parallel.PurposeRegather {
					e.Args["unit"] = o.Unit.String()
				}
			}
			if err := emit(e); err != nil {
				return err
			}
		}
		var live int64
		for i, ev := range r.memEvents {
			live += ev.Delta()
			if i+1 < len(r.memEvents) && r.memTimes[i+1] == r.memTimes[i] {
				continue // one sample per instant
			}
			if err := emit(traceEvent{Name: "allocated", Ph: "C", PID: rk, TS: r.memTimes[i] * 1e6,
				Args: map[string]any{"GiB": float64(live) / hw.GiB}}); err != nil {
				return err
			}
		}
	}
	if _, err := bw.WriteString("]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// memEventTimes stamps each memory-timeline event with the virtual time of
// the schedule op of the same micro-step, layer and phase (its start for an
// allocation, its end for a free); setup events at 0, optimizer events at
// the optimizer op.
func memEventTimes(s *parallel.Schedule, spans []simSpan, evs []memory.Event) []float64 {
	type key struct {
		micro, layer int
		phase        parallel.Phase
	}
	first := map[key]float64{}
	last := map[key]float64{}
	var optStart, optEnd float64
	for i, o := range s.Ops {
		if o.Type != parallel.OpCompute {
			continue
		}
		if o.Phase == parallel.PhaseOptimizer {
			optStart, optEnd = spans[i].start, spans[i].end
			continue
		}
		ph := o.Phase
		if ph == parallel.PhaseRecompute {
			ph = parallel.PhaseBackward
		}
		k := key{o.Micro, o.Layer, ph}
		if t, ok := first[k]; !ok || spans[i].start < t {
			first[k] = spans[i].start
		}
		last[k] = math.Max(last[k], spans[i].end)
	}
	out := make([]float64, len(evs))
	prev := 0.0
	for i, e := range evs {
		t := prev
		switch e.Phase {
		case memory.Setup:
			t = 0
		case memory.Optimizer:
			t = optStart
			if !e.Alloc {
				t = optEnd
			}
		default:
			ph := parallel.PhaseForward
			if e.Phase == memory.Backward {
				ph = parallel.PhaseBackward
			}
			k := key{e.Micro, e.Layer, ph}
			if v, ok := first[k]; ok {
				t = v
				if !e.Alloc {
					t = last[k]
				}
			}
		}
		t = math.Max(t, prev) // the timeline's order is kept
		out[i] = t
		prev = t
	}
	return out
}

// writePipelineTrace is WriteTrace for a pipeline (see there).
func (r *Result) writePipelineTrace(w io.Writer) error {
	var evs []traceEvent
	for rk, wr := range r.pipe.ranks {
		st := r.Pipeline.Stages[rk]
		evs = append(evs, traceEvent{Name: "process_name", Ph: "M", PID: rk, Args: map[string]any{"name": fmt.Sprintf("pp rank %d (stages %v)", rk, st.Stages)}})
		for tid, name := range []string{"compute", "comm", "p2p"} {
			evs = append(evs, traceEvent{Name: "thread_name", Ph: "M", PID: rk, TID: tid, Args: map[string]any{"name": name}})
		}
		for _, sp := range wr.spans {
			e := traceEvent{Ph: "X", PID: rk, TS: sp.start * 1e6, Dur: (sp.end - sp.start) * 1e6,
				Args: map[string]any{"stage": sp.op.Stage, "micro": sp.op.Micro}}
			switch sp.op.Kind {
			case parallel.PipeColl:
				e.TID, e.Cat = 1, "comm"
				e.Name = fmt.Sprintf("%s %s %s", sp.op.Coll.Coll, sp.op.Coll.Purpose, sp.op.Coll.Unit)
				e.Args["bytes"] = sp.op.Coll.Bytes()
			case parallel.PipeSend:
				e.TID, e.Cat = 2, "p2p"
				e.Name = fmt.Sprintf("send %d→%d", sp.op.Stage, sp.op.Peer)
				e.Args["bytes"], e.Args["grad"] = sp.op.Bytes, sp.op.Grad
			default:
				e.Cat = "compute"
				e.Name = fmt.Sprintf("%s s%d m%d", sp.op.Kind, sp.op.Stage, sp.op.Micro)
			}
			evs = append(evs, e)
		}
		if wr.optS > 0 {
			evs = append(evs, traceEvent{Ph: "X", PID: rk, Cat: "compute", Name: "optimizer", TS: (wr.end - wr.optS) * 1e6, Dur: wr.optS * 1e6})
		}
	}
	b, err := json.Marshal(struct {
		Unit   string       `json:"displayTimeUnit"`
		Events []traceEvent `json:"traceEvents"`
	}{"ms", evs})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// TraceRanks reads a trace's rank list (simulate's --trace-ranks): "" is
// every rank of a job of up to 16, else the first host's; "all" every
// rank; else comma-separated ranks in [0, world).
func TraceRanks(s string, world, perNode int) ([]int, error) {
	var out []int
	switch s {
	case "":
		n := world
		if world > 16 {
			n = min(world, perNode)
		}
		for r := range n {
			out = append(out, r)
		}
		return out, nil
	case "all":
		for r := range world {
			out = append(out, r)
		}
		return out, nil
	}
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 || r >= world {
			return nil, fmt.Errorf("--trace-ranks: %q is not a rank in [0, %d)", f, world)
		}
		out = append(out, r)
	}
	return out, nil
}
