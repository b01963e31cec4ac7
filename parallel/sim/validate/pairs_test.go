package validate

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/sim/published"
)

// pairRow is a TPS row of a run of file f with the measured and predicted
// TPS given.
func pairRow(name string, r published.Run, measured, predicted float64) TPSRow {
	return TPSRow{run: r, Name: name, Measured: measured, Uncalibrated: predicted}
}

// TestPairs: two runs of one file that differ only in compile are a pair,
// its ratios and error computed by hand (measured 1200 ÷ 1000 = 1.2,
// predicted 1308 ÷ 1000 = 1.308, error 1.308 ÷ 1.2 − 1 = +9%, within 10%); a run that
// also differs in its local batch, or comes from another file, pairs with
// none.
func TestPairs(t *testing.T) {
	base := published.Run{Model: "llama3-8b", GPU: "h100", File: "f.json", Precision: "bf16", Spec: published.Defaults()}
	base.GPUs, base.DPShard, base.DPReplicate, base.EP, base.LBS, base.Seq = 8, 8, 1, 1, 2, 8192
	base.AC = moe.AC{Mode: moe.ACSelective}
	eager := base
	eager.Compile = false
	otherLBS := base
	otherLBS.LBS, otherLBS.Compile = 4, false
	otherFile := eager
	otherFile.File = "g.json"
	tbl := TPSTable{Series: []Series{{Rows: []TPSRow{pairRow("eager", eager, 1000, 1000), pairRow("compiled", base, 1200, 1308),
		pairRow("lbs4", otherLBS, 1500, 1500)}}, {Rows: []TPSRow{pairRow("elsewhere", otherFile, 900, 900)}}}}
	got := Pairs(tbl)
	if len(got.Pairs) != 1 {
		t.Fatalf("pairs %+v, want one", got.Pairs)
	}
	p := got.Pairs[0]
	if p.A != "eager" || p.B != "compiled" || p.Setting != "compile: false → true" ||
		math.Abs(p.Measured-1.2) > 1e-12 || math.Abs(p.Predicted-1.308) > 1e-12 || math.Abs(p.Error-0.09) > 1e-12 {
		t.Errorf("pair %+v", p)
	}
	if got.Within10 != 1 || got.Error == nil || got.Error.Runs != 1 {
		t.Errorf("summary %+v within %d", got.Error, got.Within10)
	}
}

// TestSettingDiffUnset: a setting one run omits (the framework's default)
// prints as unset, not as Go's nil.
func TestSettingDiffUnset(t *testing.T) {
	a := published.Run{Model: "qwen3-235b-a22b", GPU: "h100", File: "f.json", Precision: "bf16", Spec: published.Defaults()}
	b := a
	b.Routing = "learned"
	if got, ok := settingDiff(a, b); !ok || got != "routing: unset → learned" {
		t.Errorf("settingDiff = %q, %v; want \"routing: unset → learned\"", got, ok)
	}
}
