package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

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
func (r *Result) WriteTrace(w io.Writer, ranks []int) error {
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
			if ev.Alloc {
				live += ev.Bytes
			} else {
				live -= ev.Bytes
			}
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
