package validate

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TestPublishedMemory is the memory validation table of issue 12:
//
//	go test ./parallel/sim/validate -run PublishedMemory -v
//
// (or `moescope validate`). For every published run it prints moescope's
// predicted peak next to the measured one, when the source measured one
// (peak_reserved_bytes, or memory_fraction × the device's capacity: both
// reserved; else peak_allocated_bytes, compared with the predicted peak
// allocated), with the relative error, and whether moescope's verdict
// (memory.Judge with the device's Outside(ep)) says the layout fits. Every
// run ran, so a "NO" in the fits column is a wrong verdict. It ends with
//
//	memory |error|: median X%, worst Y% over N runs
//	predicted not to fit: K of M runs that ran
//
// Today's prediction errors are not failures (issue 12 is to fix them); a
// run that cannot be estimated (unknown model or device, a bad layout) is.
func TestPublishedMemory(t *testing.T) {
	mem := loadTables(t).mem
	var b strings.Builder
	b.WriteString("\n")
	writeMemory(&b, mem)
	t.Log(b.String())
	if mem.Error == nil {
		t.Fatal("no published run with a measured peak")
	}
}

// TestPublishedMemoryRowRejects: a run the table cannot estimate is an
// error (Memory names the run), not a row.
func TestPublishedMemoryRowRejects(t *testing.T) {
	good := published.Run{Model: "tiny", GPU: "b200", Spec: testSpec(8, 8, 1, "full", 1, 128), Precision: "bf16", TPS: 1, Source: "x"}
	if _, err := memoryRow(good); err != nil {
		t.Fatalf("valid run: %v", err)
	}
	for name, mut := range map[string]func(*published.Run){
		"unknown device": func(r *published.Run) { r.GPU = "a100" },
		"unknown model":  func(r *published.Run) { r.Model = "no-such-model" },
		"bad layout":     func(r *published.Run) { r.DPShard = 3 },
	} {
		r := good
		mut(&r)
		if _, err := memoryRow(r); err == nil {
			t.Errorf("%s: accepted", name)
		}
		r.RunID = "R999"
		if mem, err := Memory([]published.Run{good, r}); err == nil || !strings.Contains(err.Error(), "R999") || len(mem.Rows) != 1 {
			t.Errorf("%s: Memory: %d rows, error %v; want the good row and an error naming R999", name, len(mem.Rows), err)
		}
	}
}

// testSpec is a run description over the schema's defaults.
func testSpec(gpus, dpShard, ep int, ac string, lbs, seq int) job.Spec {
	s := published.Defaults()
	s.GPUs, s.DPShard, s.DPReplicate, s.EP, s.LBS, s.Seq = gpus, dpShard, 1, ep, lbs, seq
	var err error
	if s.AC, err = moe.ParseAC(ac); err != nil {
		panic(err)
	}
	return s
}
