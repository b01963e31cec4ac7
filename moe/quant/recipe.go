package quant

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Recipe is how a training recipe quantises the operands of a linear
// layer's three GEMMs: Forward y = x·Wᵀ (x, W), DataGrad dx = dy·W (dy, W)
// and WeightGrad dW = dyᵀ·x (dy, x). BF16LastLayers is how many of the
// model's last blocks stay in high precision.
type Recipe struct {
	Name                          string
	Forward, DataGrad, WeightGrad [2]Scaling
	BF16LastLayers                int
}

// Scalings of the recipes' operands.
var (
	tensorE4M3 = Scaling{Elem: E4M3, Rule: AmaxFP32}
	tensorE5M2 = Scaling{Elem: E5M2, Rule: AmaxFP32}
	rowPow2    = Scaling{Elem: E4M3, Rule: AmaxPow2, Rows: 1}
	block1x128 = Scaling{Elem: E4M3, Rule: AmaxPow2, Cols: 128, Rows: 1}
	block128   = Scaling{Elem: E4M3, Rule: AmaxPow2, Cols: 128, Rows: 128}
	mx32       = Scaling{Elem: E4M3, Rule: MXE8M0, Cols: 32, Rows: 1}
	nvfp4Act   = Scaling{Elem: E2M1, Rule: NVFP4, Cols: 16, Rows: 1}
	nvfp4W     = Scaling{Elem: E2M1, Rule: NVFP4, Cols: 16, Rows: 16}
	nvfp4Grad  = Scaling{Elem: E2M1, Rule: NVFP4, Cols: 16, Rows: 1, Stochastic: true}
)

func withRHT(s Scaling) Scaling { s.Hadamard = true; return s }

// recipes are the recipes by name (moe/job's Precision values, plus
// torchao's rowwise_with_gw_hp).
var recipes = map[string]Recipe{
	// torchao Float8LinearConfig() (pytorch/ao 36027d82
	// torchao/float8/config.py): tensorwise, e4m3 for x and W, e5m2 for
	// the output gradient (the config's default grad_output dtype).
	"fp8-tensorwise": uniform("fp8-tensorwise", tensorE4M3, tensorE4M3, tensorE5M2),
	// TransformerEngine Float8CurrentScaling (d0067d0d
	// transformer_engine/common/recipe/__init__.py): Format.HYBRID, e4m3
	// forward and e5m2 gradients, FP32 scales from the current amax.
	"fp8-current": uniform("fp8-current", tensorE4M3, tensorE4M3, tensorE5M2),
	// torchao ROWWISE: every operand e4m3, one power-of-two scale per row
	// along the contraction axis (config.py, from_recipe_name).
	"fp8-rowwise": uniform("fp8-rowwise", rowPow2, rowPow2, rowPow2),
	// torchao ROWWISE_WITH_GW_HP: x and W rowwise in forward, dy rowwise and
	// W tensorwise (power-of-two) in the data gradient, the weight gradient
	// in high precision (same function).
	"fp8-rowwise-gw-hp": {
		Name:     "fp8-rowwise-gw-hp",
		Forward:  [2]Scaling{rowPow2, rowPow2},
		DataGrad: [2]Scaling{rowPow2, {Elem: E4M3, Rule: AmaxPow2}},
	},
	// TransformerEngine Float8BlockScaling (same recipe file): e4m3,
	// power-of-two scales, 1×128 blocks for x and dy, 128×128 for W (the
	// DeepSeek-V3 recipe; Megatron-LM's --fp8-recipe blockwise).
	"fp8-blockwise": uniform("fp8-blockwise", block1x128, block128, block1x128),
	// torchao MXLinearConfig / TE MXFP8BlockScaling: e4m3 elements, one
	// E8M0 scale per 32 elements along the contraction axis, gradients
	// e4m3 too (TE's fp8_format = Format.E4M3).
	"mxfp8": uniform("mxfp8", mx32, mx32, mx32),
	// TransformerEngine NVFP4BlockScaling (same recipe file): x 1×16, W
	// 16×16 (2-D) blocks, dy 1×16 stochastically rounded; the random
	// Hadamard transform only on the weight gradient's operands
	// (columnwise usage of x and dy). Megatron-LM keeps
	// num_layers_at_end_in_bf16 = 1 last block in BF16 under
	// first_last_layers_bf16 (d98e8a64
	// megatron/core/transformer/transformer_config.py), as the NVFP4 paper
	// (arXiv 2509.25149) keeps its last layers.
	"nvfp4": {
		Name:           "nvfp4",
		Forward:        [2]Scaling{nvfp4Act, nvfp4W},
		DataGrad:       [2]Scaling{nvfp4Grad, nvfp4W},
		WeightGrad:     [2]Scaling{withRHT(nvfp4Grad), withRHT(nvfp4Act)},
		BF16LastLayers: 1,
	},
}

func uniform(name string, x, w, g Scaling) Recipe {
	return Recipe{Name: name, Forward: [2]Scaling{x, w}, DataGrad: [2]Scaling{g, w}, WeightGrad: [2]Scaling{g, x}}
}

// refused are recipes known but not fake-quantised, with the reason.
var refused = map[string]string{
	"fp8-delayed": "its scales come from an amax history of earlier steps (TransformerEngine DelayedScaling, amax_history_len 1024); the fake quantisation models scales of the current tensor only",
}

// Names lists the recipes Lookup knows, sorted.
func Names() []string {
	n := make([]string, 0, len(recipes))
	for k := range recipes {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// Lookup returns the named recipe, or an error naming it and the known ones.
func Lookup(name string) (Recipe, error) {
	if r, ok := recipes[name]; ok {
		return r, nil
	}
	if why, ok := refused[name]; ok {
		return Recipe{}, fmt.Errorf("not fake-quantised: %s (fake-quantised: %s)", why, strings.Join(Names(), ", "))
	}
	return Recipe{}, fmt.Errorf("%q has no fake quantisation (fake-quantised: %s)", name, strings.Join(Names(), ", "))
}

// NewRand is the generator stochastic rounding draws from: seeded, so a
// run is reproducible.
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }
