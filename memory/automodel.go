package memory

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// AutoModel says that the step runs NeMo AutoModel's own MoE model classes
// and trainer (job.AutoModelTransformer), read at Automodel 2c236e081, the
// commit of the recipes its performance summary was measured with, and
// which of their modules apply. The zero value is torchtitan's.
type AutoModel struct {
	// On: AutoModel's blocks and trainer (autoModelBlock, holdsLogits).
	On bool `json:"on,omitempty"`
	// Experts: the routed experts are GroupedExpertsDeepEP (backend
	// enable_deepep; the deepep or hybridep dispatcher).
	Experts bool `json:"experts,omitempty"`
	// FakeGate: balanced routing is FakeBalancedGate (backend
	// fake_balanced_gate, which every benchmark recipe sets).
	FakeGate bool `json:"fake_gate,omitempty"`
}

// autoModelOf is the AutoModel view of recipe r.
func autoModelOf(r job.Recipe) AutoModel {
	if r.TransformerImpl != job.AutoModelTransformer {
		return AutoModel{}
	}
	balanced := (r.Routing == "" || r.Routing == job.RoutingBalanced) && r.ExpertSkew <= 1
	return AutoModel{On: true, Experts: r.Dispatcher.RowPerRank(), FakeGate: balanced}
}

// check refuses what is not modelled of AutoModel under layout l and
// options o: its GroupedExperts (no DeepEP) all-gather every
// expert-parallel rank's tokens; its pipeline schedule keeps the loss in
// the stage, not in the trainer; its parallelizer checkpoints whole
// blocks or nothing; its benchmark recipes run eager (only the DeepEP
// experts' activation is compiled, which autoModelBlock accounts for) with
// torch's cross-entropy in one piece.
func (a AutoModel) check(l job.Layout, o Options) error {
	if !a.On {
		return nil
	}
	switch {
	case l.EP > 1 && !a.Experts:
		return fmt.Errorf("transformer_impl automodel with ep = %d needs dispatcher deepep or hybridep: AutoModel's GroupedExperts all-gather every expert-parallel rank's tokens, which is not modelled", l.EP)
	case l.Stages() > 1:
		return fmt.Errorf("transformer_impl automodel with pp = %d: AutoModel's pipeline schedule is not modelled", l.Stages())
	case o.AC.Mode != moe.ACNone && o.AC.Mode != moe.ACFull:
		return fmt.Errorf("ac = %s with transformer_impl automodel: AutoModel's parallelizer checkpoints every block (activation_checkpointing: true, ac full) or none", o.AC)
	case o.Compile.Model || o.Compile.Loss || o.LossChunks > 1 || o.TE.Blocks || o.TE.Loss:
		return fmt.Errorf("transformer_impl automodel: AutoModel's recipes run eager (--compile=false; they compile only the DeepEP experts' activation) with torch's cross-entropy in one piece (compiled model %v, compiled loss %v, loss_chunks %d, TE blocks %v, TE loss %v)",
			o.Compile.Model, o.Compile.Loss, o.LossChunks, o.TE.Blocks, o.TE.Loss)
	}
	return nil
}

// autoModelBlock returns a block's saved-tensor records (rs, the eager
// table of policy ac for layer) as AutoModel's modules keep them
// (nemo_automodel/components at 2c236e081):
//
//   - GroupedExpertsDeepEP (moe/layers.py) hands its activation the
//     permuted probabilities: weighted_bias_swiglu_impl (Megatron-Core's
//     WeightedSwiGLUFunction, which saves its input and the weights) or,
//     for GPT-OSS, quick_geglu_deepep, a torch.compile'd function whose
//     one input the partitioner keeps; and its token_unpermutation merges
//     no probabilities. So, as Megatron-Core's experts (weightedExperts),
//     silu(gate) and the experts' output rows are not kept.
//   - FakeBalancedGate (moe/layers.py) computes no router: constant
//     weights and round-robin indices, none of which needs a gradient, so
//     the router's input, scores and top-k are not kept.
//   - GPT-OSS's attention (models/gpt_oss/layers.py, attention/
//     flex_attention.py) rescales flex attention's output by the sinks'
//     sigmoid(lse − sink) outside the kernel, then casts and transposes
//     it: the scale (f32, per head and token) and the rescaled copy the
//     output projection saves are kept besides flex's own output.
//
// Blocks that are fully checkpointed keep their input alone either way.
func autoModelBlock(cfg *moe.Config, layer int, sh Shape, rs []moe.SavedRecord) []moe.SavedRecord {
	a := sh.AutoModel
	if !a.On || sh.AC.FullyCheckpointed(layer) {
		return rs
	}
	tokens := int64(sh.Batch) * int64(sh.Seq)
	out := make([]moe.SavedRecord, 0, len(rs)+2)
	for _, r := range rs {
		if a.FakeGate && (r.Op == moe.OpRouter || r.Op == moe.OpRouterTopK) {
			continue
		}
		if a.Experts {
			var keep bool
			if r, keep = weightedExperts(r); !keep {
				continue
			}
		}
		out = append(out, r)
		if cfg.AttnSinks && r.Op == moe.OpAttn && r.Tensor == moe.SavedOutput {
			out = append(out,
				moe.SavedRecord{Layer: r.Layer, Op: moe.OpAttn, Tensor: moe.SavedSinkScale, Elements: tokens * int64(cfg.Heads), DType: moe.F32},
				moe.SavedRecord{Layer: r.Layer, Op: moe.OpOProj, Tensor: moe.SavedInput, Elements: r.Elements, DType: r.DType})
		}
	}
	return out
}

// weightedExperts is the routed experts' record r when they apply the
// routing probabilities in a fused activation that saves its input alone
// and the combine unpermutes without merging them (Megatron-Core's
// experts, te.go; AutoModel's GroupedExpertsDeepEP): silu(gate) and the
// experts' output rows are dropped (keep false) and the combine's weights
// become the activation's.
func weightedExperts(r moe.SavedRecord) (moe.SavedRecord, bool) {
	switch {
	case r.Op == moe.OpExpertAct && r.Tensor == moe.SavedSiLUGate:
		return r, false
	case r.Op == moe.OpCombine && r.Tensor == moe.SavedExpertOutput:
		return r, false
	case r.Op == moe.OpCombine && r.Tensor == moe.SavedWeights:
		r.Op = moe.OpExpertAct
	}
	return r, true
}
