package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
)

// seriesKey groups published runs that differ only in scale (GPU count,
// with dp_shard growing with it) or local batch: same file (one table of
// one source), model, GPU, precision, compile, policy, sequence length,
// accumulation, replica count and ep. A single-GPU run is a series of its
// own: it runs no collective and no sharding wrapper (KempnerForge's table
// lists its parallelism as "—"), so it cannot stand for the distributed
// runs; it is still predicted uncalibrated.
func seriesKey(r Run) string {
	return fmt.Sprintf("%s|%s|%s|%s|compile=%v|%s|seq=%d|ga=%d|rep=%d|ep=%d|single=%v", r.File, r.Model, r.GPU, r.Precision,
		r.Compiled(), r.AC, r.Seq, max(1, r.GradAccum), r.DPReplicate, r.EP, r.GPUs == 1)
}

// TestPublishedTPS prints the TPS error of every published run (rows of
// frameworks other than torchtitan marked "framework difference not
// modelled", still counted), then the rows of the shared validation table
// it cannot express with the feature each needs,
// uncalibrated and — for series of two or more runs — calibrated on the
// series' smallest run, and fails when a calibrated BF16 prediction is off
// by more than 10%. It also checks the table holds at least 3 series of at
// least 2 BF16 runs from at least 2 sources.
func TestPublishedTPS(t *testing.T) {
	runs, err := LoadPublished("../../testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	series := map[string][]Run{}
	var keys []string
	for _, r := range runs {
		k := seriesKey(r)
		if _, ok := series[k]; !ok {
			keys = append(keys, k)
		}
		series[k] = append(series[k], r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-32s %-6s %5s %-7s %4s %-10s %9s %9s %8s %9s %8s\n", "run", "gpu", "gpus", "rep×shd", "lbs", "ac", "measured", "uncal", "err", "cal", "err")
	var absUncal []float64
	bf16Series, sources := 0, map[string]bool{}
	for _, k := range keys {
		rs := series[k]
		// The smallest run: fewest GPUs, then smallest local batch.
		sort.SliceStable(rs, func(i, j int) bool {
			if rs[i].GPUs != rs[j].GPUs {
				return rs[i].GPUs < rs[j].GPUs
			}
			return rs[i].LBS < rs[j].LBS
		})
		var cal *Calibration
		if len(rs) >= 2 {
			if cal, err = Calibrate(rs[:1]); err != nil {
				t.Fatalf("%s: calibrate: %v", k, err)
			}
			if rs[0].Precision == "bf16" {
				bf16Series++
				sources[rs[0].File] = true
			}
		}
		for i, r := range rs {
			in, err := InputForRun(r)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			p, err := prepareSim(in)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			un, err := p.run(nil)
			if err != nil {
				t.Fatal(err)
			}
			eu := un.TPS/r.TPS - 1
			absUncal = append(absUncal, math.Abs(eu))
			name := r.Model
			if j := strings.LastIndex(name, "/"); j >= 0 {
				name = name[j+1:]
			}
			if r.Compiled() {
				name += " (compiled)"
			}
			if r.RunID != "" {
				name = r.RunID + " " + name
			}
			line := fmt.Sprintf("%-32s %-6s %5d %-7s %4d %-10s %9.0f %9.0f %+7.1f%%", name, r.GPU, r.GPUs,
				fmt.Sprintf("%d×%d", r.DPReplicate, r.DPShard), r.LBS, r.AC, r.TPS, un.TPS, 100*eu)
			if cal != nil {
				c, err := p.run(cal)
				if err != nil {
					t.Fatal(err)
				}
				ec := c.TPS/r.TPS - 1
				role := ""
				if i == 0 {
					role = " (fit)"
				}
				line += fmt.Sprintf(" %9.0f %+7.1f%%%s", c.TPS, 100*ec, role)
				if i > 0 && r.Precision == "bf16" && math.Abs(ec) > 0.10 {
					t.Errorf("%s at %d GPUs: calibrated TPS %.0f vs measured %.0f (%+.1f%%), over 10%%", name, r.GPUs, c.TPS, r.TPS, 100*ec)
				}
			}
			if !strings.HasPrefix(r.Framework, "torchtitan") {
				line += " [framework difference not modelled: " + r.Framework + "]"
			}
			fmt.Fprintln(&b, line)
		}
	}
	sort.Float64s(absUncal)
	mean := 0.0
	for _, e := range absUncal {
		mean += e
	}
	mean /= float64(len(absUncal))
	skipped, nSkipped := skippedRuns(t, runs)
	b.WriteString(skipped)
	fmt.Fprintf(&b, "uncalibrated |TPS error|: mean %.1f%%, median %.1f%%, max %.1f%% over %d runs (%d rows of the shared table skipped)\n",
		100*mean, 100*absUncal[len(absUncal)/2], 100*absUncal[len(absUncal)-1], len(absUncal), nSkipped)
	t.Log(b.String())
	if bf16Series < 3 || len(sources) < 2 {
		t.Errorf("published table: %d BF16 series of ≥ 2 runs from %d sources; want ≥ 3 from ≥ 2", bf16Series, len(sources))
	}
}
