package sim

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// The trace is valid Trace Event Format JSON: one process per rank, one
// thread per stream, an "X" event per schedule op with non-negative times
// that end by the step time, and an allocated-memory counter.
func TestWriteTrace(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 2, 1, 64, 2, "full")
	in.KeepTimeline = true
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WriteTrace(&buf, []int{0, 5}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	xs, counters := map[int]int{}, 0
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "X":
			xs[e.PID]++
			if e.TS < 0 || e.Dur < 0 || (e.TS+e.Dur)*1e-6 > r.StepTimeS*(1+1e-9) {
				t.Errorf("event %s at %g+%g µs outside the step (%g s)", e.Name, e.TS, e.Dur, r.StepTimeS)
			}
		case "C":
			counters++
		}
	}
	if xs[0] != len(r.Schedule.Ops) || xs[5] != len(r.Schedule.Ops) {
		t.Errorf("ops per rank: %v, want %d", xs, len(r.Schedule.Ops))
	}
	if counters == 0 {
		t.Error("no memory counter")
	}
	if err := r.WriteTrace(&buf, []int{8}); err == nil {
		t.Error("rank 8 of 8 accepted")
	}
	r2, _ := Simulate(simTestInput(t, "tiny", 2, 1, 1, 64, 1, "none"))
	if err := r2.WriteTrace(&buf, []int{0}); err == nil {
		t.Error("trace without timeline accepted")
	}
}

// TraceRanks: by default every rank of a small job and the first host of
// a large one; "all"; a list; a rank outside the world is refused.
func TestTraceRanks(t *testing.T) {
	for _, c := range []struct {
		s           string
		world, host int
		want        []int
	}{{"", 4, 8, []int{0, 1, 2, 3}}, {"", 32, 8, []int{0, 1, 2, 3, 4, 5, 6, 7}}, {"all", 3, 8, []int{0, 1, 2}}, {"3, 5", 8, 8, []int{3, 5}}} {
		got, err := TraceRanks(c.s, c.world, c.host)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("TraceRanks(%q, %d, %d) = %v, %v; want %v", c.s, c.world, c.host, got, err, c.want)
		}
	}
	if _, err := TraceRanks("8", 8, 8); err == nil || !strings.Contains(err.Error(), "[0, 8)") {
		t.Errorf("rank 8 of 8: error %v, want one naming [0, 8)", err)
	}
}
