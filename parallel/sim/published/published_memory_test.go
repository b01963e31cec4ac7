package published

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
)

// TestPublishedMemory is the memory validation table of issue 12:
//
//	go test ./parallel/sim/published -run PublishedMemory -v
//
// For every published run (parallel/sim/validate/testdata/published/) it prints moescope's
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
	runs, err := Load("../validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tmodel\tgpu\tgpus\tlayout\tac\tlbs\tseq\tmeasured GiB\tpredicted GiB\terror\tfits\t")
	var absErr []float64
	notFit, ran := 0, 0
	for i, r := range runs {
		name := r.RunID
		if name == "" {
			name = fmt.Sprintf("%s#%d", strings.TrimSuffix(filepath.Base(r.File), ".json"), runIndex(runs, i))
		}
		row, e, fits, err := publishedMemoryRow(r)
		if err != nil {
			t.Errorf("%s (%s, %s): %v", name, r.File, r.Source, err)
			continue
		}
		ran++
		if !fits {
			notFit++
		}
		if !math.IsNaN(e) {
			absErr = append(absErr, math.Abs(e))
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", name, row)
	}
	tw.Flush()
	sort.Float64s(absErr)
	b.WriteString("measured: r = peak reserved, a = peak allocated (compared with the predicted peak allocated); * = torch.compile; fits = moescope's verdict (every run ran); † = a framework difference not modelled (the run's unmodelled field)\n")
	t.Log(b.String())
	if len(absErr) == 0 {
		t.Fatal("no published run with a measured peak")
	}
	t.Logf("memory |error|: median %.1f%%, worst %.1f%% over %d runs", 100*median(absErr), 100*absErr[len(absErr)-1], len(absErr))
	t.Logf("predicted not to fit: %d of %d runs that ran", notFit, ran)
}

// runIndex is run i's 0-based position within its own file.
func runIndex(runs []Run, i int) int {
	n := 0
	for j := 0; j < i; j++ {
		if runs[j].File == runs[i].File {
			n++
		}
	}
	return n
}

// publishedMemoryRow predicts one run's peak and verdict: the table row
// (after the run's name), the relative error of the prediction (NaN when
// the source measured no peak or the precision is not modelled) and the
// fits verdict.
func publishedMemoryRow(r Run) (row string, relErr float64, fits bool, err error) {
	cfg, err := hf.Load(r.Model)
	if err != nil {
		return "", 0, false, err
	}
	dev, err := hw.LookupDevice(r.GPU)
	if err != nil {
		return "", 0, false, err
	}
	l := r.Layout
	o := memory.OptionsOf(r.Recipe, r.AC)
	rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: r.LBS, Seq: r.Seq, GradAccum: r.GradAccum}, o)
	if err != nil {
		return "", 0, false, err
	}
	fit := memory.Judge(rep.Peak.Reserved, dev.Outside(l.EP), dev.MemoryBytes, memory.DefaultMemoryTarget)

	gib := func(n float64) float64 { return n / (1 << 30) }
	measured, predicted, errText := "-", fmt.Sprintf("%.2f r", gib(float64(rep.Peak.Reserved))), "-"
	relErr = math.NaN()
	var meas, pred float64
	kind := ""
	if m, ok := r.MeasuredReserved(dev); ok {
		meas, pred, kind = m, float64(rep.Peak.Reserved), "r"
	} else if r.PeakAllocatedBytes != nil {
		meas, pred, kind = float64(*r.PeakAllocatedBytes), float64(rep.Peak.Allocated), "a"
	}
	if kind != "" {
		measured = fmt.Sprintf("%.2f %s", gib(meas), kind)
		predicted = fmt.Sprintf("%.2f %s", gib(pred), kind)
		if r.Precision == "bf16" {
			relErr = pred/meas - 1
			errText = fmt.Sprintf("%+.1f%%", 100*relErr)
		} else {
			errText = "prec?" // moescope's memory model is BF16 mixed precision
		}
	}
	verdict := "yes"
	if !fit.Fits {
		verdict = "NO"
	}
	modelName := strings.TrimSuffix(filepath.Base(r.Model), ".json")
	acText := r.AC.String()
	if r.Compile {
		acText += "*"
	}
	if r.Unmodelled != "" {
		errText += " †"
	}
	layout := fmt.Sprintf("%d×%d ep%d", l.DPReplicate, l.DPShard, l.EP)
	if l.Stages() > 1 {
		layout = fmt.Sprintf("pp%d×", l.PP) + layout
	}
	if l.TPDegree() > 1 {
		layout += fmt.Sprintf(" tp%d etp%d", l.TPDegree(), l.ETP)
	}
	if max(1, r.GradAccum) > 1 {
		layout += fmt.Sprintf(" ga%d", r.GradAccum)
	}
	row = strings.Join([]string{modelName, r.GPU, fmt.Sprint(r.GPUs), layout, acText, fmt.Sprint(r.LBS), fmt.Sprint(r.Seq),
		measured, predicted, errText, verdict}, "\t")
	return row, relErr, fit.Fits, nil
}

// median of sorted values (the mean of the middle two for an even count).
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// TestPublishedMemoryRowRejects: a run the table cannot estimate is an
// error (TestPublishedMemory reports it naming the run), not a row.
func TestPublishedMemoryRowRejects(t *testing.T) {
	good := Run{Model: "tiny", GPU: "b200", Spec: testSpec(8, 8, 1, "full", 1, 128), Precision: "bf16", TPS: 1, Source: "x"}
	if _, _, _, err := publishedMemoryRow(good); err != nil {
		t.Fatalf("valid run: %v", err)
	}
	for name, mut := range map[string]func(*Run){
		"unknown device": func(r *Run) { r.GPU = "a100" },
		"unknown model":  func(r *Run) { r.Model = "no-such-model" },
		"bad layout":     func(r *Run) { r.DPShard = 3 },
	} {
		r := good
		mut(&r)
		if _, _, _, err := publishedMemoryRow(r); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSeedRunWithinTarget: the study this project reproduces ran
// Qwen3-30B-A3B on 128 B200 at selective AC, local batch 22, measuring 0.93
// of device memory (parallel/sim/validate/testdata/published/aleph-alpha-seed-…json). moescope
// must say it fits and is within a 0.93 target, so that
// `plan --memory-target 0.93` can return that local batch.
func TestSeedRunWithinTarget(t *testing.T) {
	runs, err := Load("../validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range runs {
		if !strings.HasPrefix(filepath.Base(r.File), "aleph-alpha-seed") || r.GPUs != 128 || r.LBS != 22 {
			continue
		}
		found = true
		in, err := InputForRun(r)
		if err != nil {
			t.Fatal(err)
		}
		in.MemoryTarget = 0.93
		res, err := sim.Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Fits || !res.WithinTarget || res.MemoryFraction > 0.93 {
			t.Errorf("seed run at 128 GPUs, lbs 22: fits %v, within 0.93 %v, memory fraction %.3f", res.Fits, res.WithinTarget, res.MemoryFraction)
		}
	}
	if !found {
		t.Fatal("the seed's 128-GPU, lbs 22 run is not in parallel/sim/validate/testdata/published")
	}
}
