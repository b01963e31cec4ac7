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
