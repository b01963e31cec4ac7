package hf

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref"
)

// torchrefExpected is expected.json as testdata/torchref/torchref.py writes it.
type torchrefExpected struct {
	Loss      float64 `json:"loss"`       // mean cross-entropy over predicted positions
	AuxLoss   float64 `json:"aux_loss"`   // HF load_balancing_loss_func, or DeepSeek-MoE's seq_aux loss summed over layers (computed even when not added)
	TotalLoss float64 `json:"total_loss"` // what grads.safetensors is the gradient of
	AuxAdded  bool    `json:"aux_added"`
	AuxCoef   float64 `json:"aux_coef"`
	// Shifted holds the same losses under torchtitan's input convention
	// (inputs tokens[:, :-1], so the last token is not routed), written when
	// the aux loss is added: only the aux loss differs from HF's.
	Shifted *torchrefExpected `json:"shifted"`
}

// torchref is one reference case: config, weights, tokens, expected losses
// and gradients (float64, in Params order).
type torchref struct {
	name   string
	dir    string
	cfg    *moe.Config
	tokens [][]int
	exp    torchrefExpected
	grads  [][]float64
	// gradsShifted is the gradient under Shifted's convention (nil when
	// equal to grads).
	gradsShifted [][]float64
}

func loadTorchref(t *testing.T, name string) torchref {
	t.Helper()
	r := torchref{name: name, dir: filepath.Join(torchrefDir, name)}
	var err error
	if r.cfg, err = Load(filepath.Join(r.dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	for file, v := range map[string]any{"tokens.json": &r.tokens, "expected.json": &r.exp} {
		b, err := os.ReadFile(filepath.Join(r.dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s/%s: %v", name, file, err)
		}
	}
	if r.grads, err = LoadParams[float64](filepath.Join(r.dir, "grads.safetensors"), r.cfg); err != nil {
		t.Fatal(err)
	}
	if r.exp.Shifted != nil {
		if r.gradsShifted, err = LoadParams[float64](filepath.Join(r.dir, "grads_shifted.safetensors"), r.cfg); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// torchrefDiff is how far a run is from the PyTorch reference.
type torchrefDiff struct {
	lossRel, auxRel, totalRel float64
	// worstGrad is max over tensors of max|g − g_ref| / max|g_ref|, and
	// worstName the tensor where it occurs.
	worstGrad float64
	worstName string
}

// runTorchref runs ForwardBackward, whose sequences are s+1 ids of which
// the first s are inputs (torchtitan's convention), and compares it with the
// matching reference: the shifted one where the aux loss makes them differ.
// With hf it runs ForwardBackwardHF (every id an input) and compares with
// the reference under HF's convention.
func runTorchref[T float32 | float64](t *testing.T, r torchref, o ref.Options, hf bool) torchrefDiff {
	t.Helper()
	m, err := ref.NewModel[T](r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := LoadParams[T](r.dir, r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetTensors(ps); err != nil {
		t.Fatal(err)
	}
	m.ZeroGrad()
	o.AuxCoef = ref.HFAuxCoef(r.cfg)
	if hf {
		res, err := m.ForwardBackwardHF(r.tokens, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		return compareTorchref(res, m.Params, m.Grads(), r.exp, r.grads)
	}
	res, err := m.ForwardBackward(r.tokens, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	exp, grads := r.exp, r.grads
	if r.exp.Shifted != nil {
		exp, grads = *r.exp.Shifted, r.gradsShifted
		exp.AuxAdded = r.exp.AuxAdded
	}
	return compareTorchref(res, m.Params, m.Grads(), exp, grads)
}

// compareTorchref measures a result and its gradients against a reference.
func compareTorchref[T float32 | float64](res ref.Result, params []moe.Param, got [][]T, exp torchrefExpected, want [][]float64) torchrefDiff {
	rel := func(got, want float64) float64 { return math.Abs(got-want) / math.Max(math.Abs(want), 1e-30) }
	d := torchrefDiff{lossRel: rel(res.Loss, exp.Loss), totalRel: rel(res.Total, exp.TotalLoss)}
	if exp.AuxAdded {
		d.auxRel = rel(res.Aux, exp.AuxLoss)
	}
	for i, g := range got {
		w := want[i]
		var maxRef, maxDiff float64
		for j, v := range w {
			maxRef = math.Max(maxRef, math.Abs(v))
			maxDiff = math.Max(maxDiff, math.Abs(float64(g[j])-v))
		}
		var q float64
		switch {
		case maxRef > 0:
			q = maxDiff / maxRef
		case maxDiff > 0: // a zero reference (buffer) must stay exactly zero
			q = math.Inf(1)
		}
		if q > d.worstGrad || d.worstName == "" {
			d.worstGrad, d.worstName = q, params[i].Name
		}
	}
	return d
}

// TestTorchref compares the reference implementation with the independent
// PyTorch model of testdata/torchref (float64 autograd from the same stored
// weights) on ten configurations: dense, MoE, shared experts, sigmoid
// routing with bias and grouped top-k, sliding window, aux loss on,
// grouped-query attention with 4 query heads on 2 KV heads,
// DeepSeek-MoE with its per-sequence aux loss, and multi-head latent
// attention as DeepSeek-V3 (query latent, interleaved RoPE, value heads
// narrower than q·k, sigmoid grouped routing) and DeepSeek-V2 (q_proj,
// complex RoPE, value heads wider, softmax group-limited routing) have it;
// GPT-OSS (testdata/torchref/gptoss.py) and Llama 4 (llama4.py: chunked
// RoPE layers with the L2 QK-norm, a NoPE layer with temperature tuning,
// dense and MoE layers, input-scaled sigmoid top-1 routing beside a shared
// expert, experts stacked in halves). Both conventions are checked: torchtitan's (ForwardBackward; the
// script's "shifted" reference where the aux loss tells them apart) and
// HF's (ForwardBackwardHF). Float32 must be within the bounds (loss
// relative 1e-5, every gradient's max abs difference ≤ 1e-4 × its max abs
// value) under every checkpointing policy; float64 must agree to the
// rounding of the stored float32 gradients.
func TestTorchref(t *testing.T) {
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}
	for _, name := range torchrefConfigs {
		t.Run(name, func(t *testing.T) {
			r := loadTorchref(t, name)
			if got := ref.HFAuxCoef(r.cfg); got != r.exp.AuxCoef {
				t.Errorf("aux coefficient %v from config.json, the PyTorch model used %v", got, r.exp.AuxCoef)
			}
			check := func(label string, d torchrefDiff, lossTol, gradTol float64) {
				if d.lossRel > lossTol || d.totalRel > lossTol || d.auxRel > lossTol {
					t.Errorf("%s: loss rel diff %.3g, aux %.3g, total %.3g; want ≤ %g", label, d.lossRel, d.auxRel, d.totalRel, lossTol)
				}
				if d.worstGrad > gradTol {
					t.Errorf("%s: gradient of %s: max abs diff = %.3g × its max abs value; want ≤ %g", label, d.worstName, d.worstGrad, gradTol)
				}
				t.Logf("%-16s loss rel %.2e  aux rel %.2e  worst grad %.2e × max (%s)", label, d.lossRel, d.auxRel, d.worstGrad, d.worstName)
			}
			for _, ac := range policies {
				check(fmt.Sprintf("float32 %s", ac), runTorchref[float32](t, r, ref.Options{AC: ac}, false), 1e-5, 1e-4)
			}
			// Small, uneven attention tiles: many tiles per sequence, partly
			// and fully masked ones (causal and windowed) skipped or clipped.
			check("float32 tiles 3×2", runTorchref[float32](t, r, ref.Options{AC: moe.AC{Mode: moe.ACSelective}, TileQ: 3, TileK: 2}, false), 1e-5, 1e-4)
			// Float64 from the same weights: the only error left is the
			// references' own rounding to float32 (relative 2⁻²⁴ ≈ 6e-8 of
			// each element, so ≤ 6e-8 × the max); the loss is stored in float64.
			check("float64 selective", runTorchref[float64](t, r, ref.Options{AC: moe.AC{Mode: moe.ACSelective}}, false), 1e-12, 1e-7)
			// HF's convention (input_ids = labels = tokens), the loss
			// `moescope grad` reports: ForwardBackwardHF's three passes when
			// the aux loss is on.
			check("float32 HF", runTorchref[float32](t, r, ref.Options{AC: moe.AC{Mode: moe.ACSelective}}, true), 1e-5, 1e-4)
			check("float64 HF", runTorchref[float64](t, r, ref.Options{AC: moe.AC{Mode: moe.ACNone}}, true), 1e-12, 1e-7)
		})
	}
}

// TestForwardBackwardHFScale: ForwardBackwardHF accumulates scale times the
// gradient into Grad, as ForwardBackward does. Scaling by 2⁻¹ is exact in
// binary floating point and commutes with every rounding, so scale ½ gives
// bit for bit half the gradient of scale 1 (the aux-loss passes included).
func TestForwardBackwardHFScale(t *testing.T) {
	r := loadTorchref(t, "deepseek")
	grad := func(scale float64) []float64 {
		m, err := ref.NewModel[float64](r.cfg)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := LoadParams[float64](r.dir, r.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetTensors(ps); err != nil {
			t.Fatal(err)
		}
		if _, err := m.ForwardBackwardHF(r.tokens, scale, ref.Options{AuxCoef: ref.HFAuxCoef(r.cfg)}); err != nil {
			t.Fatal(err)
		}
		return m.Grad
	}
	one, half := grad(1), grad(0.5)
	for i := range one {
		if one[i]/2 != half[i] {
			t.Fatalf("gradient element %d: %v at scale 1, %v at scale ½", i, one[i], half[i])
		}
	}
}
