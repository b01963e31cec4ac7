package plan

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestCheckRecipeRefusesMegatronSettings: settings torchtitan has no
// field for (Megatron-Core's storage, modules, token dropping) are refused
// by both exports, naming the flag, rather than dropped from the job; loss
// chunks are refused by the v0.2.2 TOML only (main's registry chunks).
func TestCheckRecipeRefusesMegatronSettings(t *testing.T) {
	for _, c := range []struct {
		edit func(*job.Recipe)
		flag string
	}{
		{func(r *job.Recipe) { r.MasterDType = moe.F32 }, "--master-dtype"},
		{func(r *job.Recipe) { r.TransformerImpl = job.TETransformer }, "--transformer-impl"},
		{func(r *job.Recipe) { r.LossImpl = job.TELoss }, "--loss-impl"},
		{func(r *job.Recipe) { r.DDPImpl = job.MegatronDDP }, "--ddp-impl"},
		{func(r *job.Recipe) { r.CapacityFactor = 1.25 }, "--capacity-factor"},
		{func(r *job.Recipe) { r.Routing = "counts.json" }, "--routing"},
		{func(r *job.Recipe) { r.FusedQKV = true }, "--fused-qkv"},
		{func(r *job.Recipe) { r.CUDAGraphs = job.LayerGraphs }, "--cuda-graphs = layers"},
	} {
		for _, target := range []TorchtitanTarget{TorchtitanTOML, TorchtitanPy} {
			r := job.DefaultRecipe()
			c.edit(&r)
			if err := target.CheckRecipe(r); err == nil || !strings.Contains(err.Error(), c.flag) {
				t.Errorf("%s: %v, want a refusal naming %s", target, err, c.flag)
			}
		}
	}
	r := job.DefaultRecipe()
	r.LossChunks = 8
	if TorchtitanTOML.CheckRecipe(r) == nil || TorchtitanPy.CheckRecipe(r) != nil {
		t.Errorf("loss chunks: TOML %v, Python %v", TorchtitanTOML.CheckRecipe(r), TorchtitanPy.CheckRecipe(r))
	}
}

// TestCUDAGraphsExport: torchtitan main captures the forward and backward
// unless training.disable_cuda_graphs (b5bcd76 torchtitan/config/configs.py,
// default False), so the Python export always says which the plan priced;
// v0.2.2 has no training graphs, so its TOML refuses full graphs.
func TestCUDAGraphsExport(t *testing.T) {
	r := job.DefaultRecipe()
	r.CUDAGraphs = job.FullGraphs
	if err := TorchtitanTOML.CheckRecipe(r); err == nil || !strings.Contains(err.Error(), "--cuda-graphs = full") {
		t.Errorf("TOML with full graphs: %v", err)
	}
	if err := TorchtitanPy.CheckRecipe(r); err != nil {
		t.Errorf("Python with full graphs: %v", err)
	}
	for g, want := range map[job.CUDAGraphs]string{"": "disable_cuda_graphs = True", job.NoGraphs: "disable_cuda_graphs = True",
		job.FullGraphs: "disable_cuda_graphs = False"} {
		if got := pyGraphsLine(g); !strings.Contains(got, "config.training."+want) {
			t.Errorf("graphs %q: %q, want config.training.%s", g, got, want)
		}
	}
}
