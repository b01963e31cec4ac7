package moetest

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TinyMoE is a fixed 2-layer MoE model small enough for -race tests of
// ranks and schedules: both layers MoE with 4 experts, top-2, HF's aux loss
// on.
func TinyMoE() *moe.Config {
	return &moe.Config{
		Name: "tiny", ModelType: "qwen3_moe", Vocab: 32, Hidden: 8, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 4,
		MoELayer: []bool{true, true}, Window: []int{0, 0},
		Experts: 4, TopK: 2, ExpertFFN: 6, Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true,
		QKNorm: moe.QKNormHead, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6,
		AuxLossCoef: 0.01, OutputRouterLogits: true, InitRange: 0.1,
	}
}

// TinyMoELayers is TinyMoE with one block per entry of moeLayers, block i
// a MoE block when moeLayers[i] (a dense one of FFN width 6 otherwise),
// full attention everywhere: the pipeline tests' deeper models.
func TinyMoELayers(moeLayers ...bool) *moe.Config {
	c := TinyMoE()
	c.Layers = len(moeLayers)
	c.MoELayer = append([]bool(nil), moeLayers...)
	c.Window = make([]int, len(moeLayers))
	for _, m := range moeLayers {
		if !m {
			c.DenseFFN = 6
		}
	}
	return c
}

// FSDPLayout is the resolved FSDP layout of gpus ranks in rep replicas with
// expert parallelism ep, resharding after forward (torchtitan's default).
func FSDPLayout(t testing.TB, gpus, rep, ep int) job.Layout {
	t.Helper()
	l := job.Layout{GPUs: gpus, DPReplicate: rep, EP: ep, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	return l
}
