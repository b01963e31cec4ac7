package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// TestRoutingFile: a routing file replays its counts exactly as the same
// counts given in code, and counts that send every row to the first EP
// rank's experts (by hand: that rank receives ep = 4 × the mean rows) make
// the step slower than balanced routing. train --json's other keys are
// ignored. A skew beside learned routing or a file, and a file of the wrong
// shape are refused, naming what is wrong.
func TestRoutingFile(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
	base, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "train.json")
	if err := os.WriteFile(file, []byte(`{"losses": [3.1], "expert_counts": [[1024, 0, 0, 0]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	in.Routing = job.Routing(file)
	fromFile, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Routing, in.ExpertCounts = "", [][]int64{{1024, 0, 0, 0}}
	direct, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.StepTimeS != direct.StepTimeS || !(fromFile.StepTimeS > base.StepTimeS) {
		t.Errorf("file %g s, same counts in code %g s, balanced %g s", fromFile.StepTimeS, direct.StepTimeS, base.StepTimeS)
	}
	if !strings.Contains(fromFile.Exactness, "4.000× the mean") {
		t.Errorf("exactness %q does not name the most loaded rank's 4× the mean", fromFile.Exactness)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"expert_counts": [[1, 2, 3]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit func(*Input)
		want string
	}{
		{func(in *Input) { in.Routing, in.ExpertSkew = job.RoutingLearned, 2 }, "expert_skew = 2"},
		{func(in *Input) { in.Routing, in.ExpertSkew = job.Routing(file), 2 }, "expert_skew = 2"},
		{func(in *Input) { in.Routing = job.Routing(bad) }, "bad.json: expert_counts: expert counts row 0 has 3 entries for 4 experts"},
	} {
		in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
		c.edit(&in)
		if _, err := Simulate(in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want %q", err, c.want)
		}
	}
}

// TestRoutingFilePipeline: counts replay through pipeline stages as they
// do without: a file equals the same counts in code, and counts that send
// every (token, slot) row to the first EP rank's experts (by hand: top-2
// of 4 experts, ep 2, that rank's 2 experts take every row, 2 × the
// mean) make the step slower and the peak allocated larger than balanced routing.
func TestRoutingFilePipeline(t *testing.T) {
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 8, PP: 2, DPShard: 4, EP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	in := Input{Spec: job.Spec{Model: pipelineConfig(4), Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 4, Seq: 16, GradAccum: 1}, Recipe: job.EagerRecipe()}, Device: dev}
	base, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "counts.json")
	if err := os.WriteFile(file, []byte(`{"expert_counts": [[64, 64, 0, 0]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	in.Routing = job.Routing(file)
	fromFile, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Routing, in.ExpertCounts = "", [][]int64{{64, 64, 0, 0}}
	direct, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.StepTimeS != direct.StepTimeS || !(fromFile.StepTimeS > base.StepTimeS) {
		t.Errorf("file %g s, same counts in code %g s, balanced %g s", fromFile.StepTimeS, direct.StepTimeS, base.StepTimeS)
	}
	if !(fromFile.PeakAllocatedBytes > base.PeakAllocatedBytes) || fromFile.PeakAllocatedBytes != direct.PeakAllocatedBytes {
		t.Errorf("peak allocated: file %d B, in code %d B, balanced %d B", fromFile.PeakAllocatedBytes, direct.PeakAllocatedBytes, base.PeakAllocatedBytes)
	}
}
