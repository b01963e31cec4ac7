package sim

import (
	"fmt"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Compute under tensor parallelism is priced at the shapes one tp rank
// runs, not by dividing times: the column-parallel linears have 1/tp of
// their output features (heads, FFN widths, the vocabulary), the row-parallel
// ones 1/tp of their input features, attention 1/tp of the heads, the
// routed experts 1/ExpertTP of their width; the sequence-parallel norms and
// residuals see T/tp tokens, the replicated router all T, and under etp = 1
// each tp rank dispatches, computes and combines 1/tp of the routed rows
// (Layout.TokensPerExpertRank).

// tpLocal is cfg as one tp rank of l holds it: the heads, KV heads and FFN
// widths divided by tp, the experts' width by the expert TP degree, the
// vocabulary by ⌈V/tp⌉. cfg itself when tp = 1.
func tpLocal(cfg *moe.Config, l job.Layout) (*moe.Config, error) {
	tp := l.TPDegree()
	if tp == 1 {
		return cfg, nil
	}
	c := *cfg
	c.Heads /= tp
	c.KVHeads /= tp
	c.DenseFFN /= tp
	switch {
	case c.SharedExperts == 0:
	case c.SharedFFN%tp == 0:
		c.SharedFFN /= tp
	case c.SharedExperts%tp == 0:
		c.SharedExperts /= tp
	default:
		return nil, fmt.Errorf("simulate: tp = %d divides shared_experts × shared_ffn = %d × %d but neither factor; the per-rank shapes are not modelled", tp, c.SharedExperts, c.SharedFFN)
	}
	if c.IsMoE() {
		c.ExpertFFN /= l.ExpertTP()
	}
	c.Vocab = (c.Vocab + tp - 1) / tp
	return &c, nil
}

// tpOps returns the op records of one micro-step as one tp rank of l runs
// them: flops.Ops of the local config (tpLocal), with the
// sequence-parallel ops' tokens and, under etp = 1, the routed rows divided.
func tpOps(cfg *moe.Config, l job.Layout, s flops.Shape, ac moe.AC) ([]moe.OpRecord, error) {
	local, err := tpLocal(cfg, l)
	if err != nil {
		return nil, err
	}
	recs, err := flops.Ops(local, s, ac, flops.DefaultTile)
	if err != nil || local == cfg {
		return recs, err
	}
	tp, rows := int64(l.TPDegree()), int64(l.TokensPerExpertRank())
	for i, r := range recs {
		switch r.Op {
		case moe.OpAttnNorm, moe.OpFFNNorm, moe.OpFinalNorm, moe.OpResidual:
			recs[i].Count /= tp
		case moe.OpDispatch, moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertAct, moe.OpExpertDown, moe.OpCombine:
			recs[i].Count /= rows
		}
	}
	return recs, nil
}

// checkAsyncTP refuses async TP without a compiled model, as torchtitan
// does with or without pipeline parallelism: v0.2.2 (73a0e6979dd1)
// models/qwen3/infra/parallelize.py raises "Async TP requires
// torch.compile" and distributed/tensor_parallel.py maybe_enable_async_tp
// "Async TP requires 'model' in --compile.components and --compile.enable"
// (micro-pipeline TP is an Inductor pass, torch._inductor.config.
// _micro_pipeline_tp), for every stage's model chunk that pipeline_llm
// parallelizes; main (b5bcd76c66d0) CompileConfig.__post_init__ raises the
// latter.
func checkAsyncTP(in Input) error {
	if tp := in.Layout.TPDegree(); tp > 1 && in.Layout.AsyncTP && !in.compiledModel() {
		return fmt.Errorf("simulate: async_tp with tp = %d (pp = %d) requires compile (torchtitan: \"Async TP requires torch.compile\"; async TP is an Inductor pass)", tp, in.Layout.Stages())
	}
	return nil
}
