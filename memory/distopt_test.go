package memory

import (
	"encoding/json"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// megatronRecipe is Megatron-Core's distributed optimizer as the run
// description states it: bf16 model parameters, fp32 main gradients
// (grad_reduce_in_fp32) and an fp32 main copy of the parameters kept and
// sharded with the Adam moments.
func megatronRecipe(t *testing.T) job.Recipe {
	t.Helper()
	r := job.EagerRecipe()
	r.ParamDType, r.GradDType, r.MasterDType = moe.BF16, moe.F32, moe.F32
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDistributedOptimizerState checks the state of Megatron-Core's
// distributed optimizer against its own table (Megatron-LM
// docs/source/api-guide/dist_optimizer.md at
// 0d8e0714cd29c01e164fe6de9f532182bdffa942): bf16 parameters with fp32
// gradients take 18 bytes per parameter without it and 6 + 12/d with it,
// d the data-parallel size. Ψ = denseParams (by hand, denseCfg).
func TestDistributedOptimizerState(t *testing.T) {
	cfg := denseCfg()
	const psi, d = denseParams, 8
	o := OptionsOf(megatronRecipe(t), moe.AC{Mode: moe.ACNone})
	for _, c := range []struct {
		s    job.Sharding
		want int64
	}{
		{job.ShardZeRO1, 6*psi + 12*psi/d}, // distributed optimizer
		{job.ShardDDP, 18 * psi},           // plain DDP with Megatron's optimizer
	} {
		units, err := Units(cfg, layout(d, d, 1, c.s))
		if err != nil {
			t.Fatal(err)
		}
		if got := StateOf(units, c.s, o).Total(); got != c.want {
			t.Errorf("%s: state %d bytes, want %d (Megatron's table)", c.s, got, c.want)
		}
	}
}

// TestDistributedOptimizerNoCastCopy: with bf16 parameters the model
// computes with its stored parameters, so the step allocates no compute
// copy of the weights (gathered_weights 0) and the stored parameters are
// 2·Ψ bytes (Megatron's Float16Module holds the model in bf16).
func TestDistributedOptimizerNoCastCopy(t *testing.T) {
	cfg := denseCfg()
	o := OptionsOf(megatronRecipe(t), moe.AC{Mode: moe.ACNone})
	r, err := Estimate(cfg, layout(8, 8, 1, job.ShardZeRO1), Batch{LBS: 1, Seq: 16}, o)
	if err != nil {
		t.Fatal(err)
	}
	if w := r.Peak.Live[CatWeights]; w != 0 {
		t.Errorf("gathered weights at peak: %d bytes, want 0", w)
	}
	if p := r.State.Params; p != 2*denseParams {
		t.Errorf("parameters %d bytes, want 2Ψ = %d", p, 2*denseParams)
	}
}

func TestMasterDTypeJSON(t *testing.T) {
	var r job.Recipe
	if err := json.Unmarshal([]byte(`{"master_dtype":"f32","param_dtype":"bf16"}`), &r); err != nil {
		t.Fatal(err)
	}
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	if o := OptionsOf(r, moe.AC{}); o.Master != moe.F32 {
		t.Errorf("master %q, want f32", o.Master)
	}
	r.MasterDType = "f8"
	if err := r.Validate(); err == nil {
		t.Error("master_dtype f8 accepted")
	}
	d := job.DefaultRecipe()
	if err := d.Resolve(); err != nil || d.MasterDType != "" {
		t.Errorf("default master %q (%v), want none", d.MasterDType, err)
	}
}
