package sim

import (
	"testing"
)

// TestModulesRecomputePriced: Megatron's recompute modules cost backward
// time for their norms' and activations' forward repeats only: more
// recompute than none (flash attention's own alone), less than torchtitan's
// per-op selective, which also repeats half the linears and every grouped
// GEMM; the saved norm outputs and activations they free lower the peak;
// model FLOPs (MFU × step time) do not change.
func TestModulesRecomputePriced(t *testing.T) {
	res := map[string]Result{}
	for _, ac := range []string{"none", "modules:layernorm,moe_act", "selective"} {
		r, err := Simulate(simTestInput(t, "tiny", 1, 1, 2, 64, 1, ac))
		if err != nil {
			t.Fatal(err)
		}
		res[ac] = r
	}
	none, mods, sel := res["none"], res["modules:layernorm,moe_act"], res["selective"]
	if !(none.Breakdown.RecomputeS < mods.Breakdown.RecomputeS && mods.Breakdown.RecomputeS < sel.Breakdown.RecomputeS) {
		t.Errorf("recompute s: none %g, modules %g, selective %g; want increasing", none.Breakdown.RecomputeS, mods.Breakdown.RecomputeS, sel.Breakdown.RecomputeS)
	}
	if !(mods.PeakAllocatedBytes < none.PeakAllocatedBytes) {
		t.Errorf("peak allocated: modules %d B, none %d B", mods.PeakAllocatedBytes, none.PeakAllocatedBytes)
	}
	if !near(mods.MFU*mods.StepTimeS, none.MFU*none.StepTimeS, 1e-12) {
		t.Errorf("model FLOPs differ: MFU·step %g vs %g", mods.MFU*mods.StepTimeS, none.MFU*none.StepTimeS)
	}
}

// TestModuleMoEPriced: Megatron's moe module (the MoE layer's forward
// again before its backward, Megatron-LM d98e8a6 moe_layer.py) costs more
// recompute than layernorm and moe_act (it repeats the router and every
// grouped GEMM besides the activation) and less than full AC (it leaves
// the attention half alone); it runs the all-to-alls full AC runs (count
// exchange, dispatch and combine again per MoE layer), so its all-to-all
// time equals full's and exceeds none's; it frees the MoE layer's saved
// tensors; model FLOPs do not change.
func TestModuleMoEPriced(t *testing.T) {
	res := map[string]Result{}
	for _, ac := range []string{"none", "modules:layernorm,moe_act", "modules:moe", "full"} {
		r, err := Simulate(simTestInput(t, "tiny", 2, 2, 2, 64, 1, ac))
		if err != nil {
			t.Fatal(err)
		}
		res[ac] = r
	}
	none, mods, moeMod, full := res["none"], res["modules:layernorm,moe_act"], res["modules:moe"], res["full"]
	if !(mods.Breakdown.RecomputeS < moeMod.Breakdown.RecomputeS && moeMod.Breakdown.RecomputeS < full.Breakdown.RecomputeS) {
		t.Errorf("recompute s: layernorm,moe_act %g, moe %g, full %g; want increasing", mods.Breakdown.RecomputeS, moeMod.Breakdown.RecomputeS, full.Breakdown.RecomputeS)
	}
	a2a := func(r Result) float64 { return r.Breakdown.CommS["all_to_all"] }
	if !(a2a(none) > 0 && a2a(moeMod) > a2a(none) && near(a2a(moeMod), a2a(full), 1e-9)) {
		t.Errorf("all-to-all s: none %g, moe %g, full %g; want moe = full > none", a2a(none), a2a(moeMod), a2a(full))
	}
	if !(moeMod.PeakAllocatedBytes < none.PeakAllocatedBytes) {
		t.Errorf("peak allocated: moe %d B, none %d B", moeMod.PeakAllocatedBytes, none.PeakAllocatedBytes)
	}
	if !near(moeMod.MFU*moeMod.StepTimeS, none.MFU*none.StepTimeS, 1e-12) {
		t.Errorf("model FLOPs differ: MFU·step %g vs %g", moeMod.MFU*moeMod.StepTimeS, none.MFU*none.StepTimeS)
	}
}
