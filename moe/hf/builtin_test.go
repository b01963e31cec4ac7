package hf

import (
	"math"
	"reflect"
	"testing"

	"github.com/moescope/moescope/moe"
)

// countParams sums the trained tensors of c.Params(): total, and active
// with only TopK experts of each MoE layer.
func countParams(c *moe.Config) (total, active int64) {
	for _, p := range c.Params() {
		if p.Buffer {
			continue
		}
		total += p.Elements()
		if p.Group != moe.GroupRouted || p.Expert < c.TopK {
			active += p.Elements()
		}
	}
	return total, active
}

// TestBuiltinParams pins every built-in's parameter counts against closed
// forms written out by hand from its config.json (embedding V·D, LM head
// V·D, final norm D; per layer q/k/v/o, two norms, QK-norm, FFN or router +
// experts + shared experts), and against the figure its publisher gives.
func TestBuiltinParams(t *testing.T) {
	for _, tc := range []struct {
		name          string
		total, active int64
		// published total and active (billions) with the rounding they carry
		pubTotal, pubActive, tol float64
		pubSource                string
	}{
		{"qwen3-30b-a3b",
			2*151936*2048 + 2048 + 48*(2048*(4096+512+512)+4096*2048+2*2048+2*128+128*2048+128*3*768*2048),
			2*151936*2048 + 2048 + 48*(2048*(4096+512+512)+4096*2048+2*2048+2*128+128*2048+8*3*768*2048),
			30.5, 3.3, 0.05, "huggingface.co/Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"},
		{"qwen3-235b-a22b",
			2*151936*4096 + 4096 + 94*(4096*(8192+512+512)+8192*4096+2*4096+2*128+128*4096+128*3*1536*4096),
			2*151936*4096 + 4096 + 94*(4096*(8192+512+512)+8192*4096+2*4096+2*128+128*4096+8*3*1536*4096),
			235, 22, 0.5, "huggingface.co/Qwen/Qwen3-235B-A22B model card: 235B total, 22B activated"},
		{"mixtral-8x7b",
			2*32000*4096 + 4096 + 32*(4096*(4096+1024+1024)+4096*4096+2*4096+8*4096+8*3*14336*4096),
			2*32000*4096 + 4096 + 32*(4096*(4096+1024+1024)+4096*4096+2*4096+8*4096+2*3*14336*4096),
			46.7, 12.9, 0.05, "mistral.ai 'Mixtral of experts' (2023-12): 46.7B total, 12.9B per token"},
		{"olmoe-1b-7b",
			2*50304*2048 + 2048 + 16*(2048*3*2048+2048*2048+2*2048+2048+2048+64*2048+64*3*1024*2048),
			2*50304*2048 + 2048 + 16*(2048*3*2048+2048*2048+2*2048+2048+2048+64*2048+8*3*1024*2048),
			6.9, 1.3, 0.05, "OLMoE paper arXiv:2409.02060: 6.9B total, 1.3B active"},
		{"deepseek-moe-16b",
			2*102400*2048 + 2048 + 28*(4*2048*2048+2*2048) + 3*10944*2048 + 27*(64*2048+64*3*1408*2048+3*2816*2048),
			2*102400*2048 + 2048 + 28*(4*2048*2048+2*2048) + 3*10944*2048 + 27*(64*2048+6*3*1408*2048+3*2816*2048),
			16.4, 2.8, 0.05, "DeepSeekMoE paper arXiv:2401.06066 / model card: 16.4B total, 2.8B activated"},
		{"glm-4.5-air",
			2*151552*4096 + 4096 + 46*(4096*(12288+1024+1024)+12288*4096+12288+2*1024+2*4096) + 3*10944*4096 + 45*(128*4096+128*3*1408*4096+3*1408*4096),
			2*151552*4096 + 4096 + 46*(4096*(12288+1024+1024)+12288*4096+12288+2*1024+2*4096) + 3*10944*4096 + 45*(128*4096+8*3*1408*4096+3*1408*4096),
			106, 12, 1, "huggingface.co/zai-org/GLM-4.5-Air model card: 106B total, 12B active (active excludes embedding and LM head here, see below)"},
		{"llama3-8b",
			2*128256*4096 + 4096 + 32*(4096*(4096+1024+1024)+4096*4096+2*4096+3*14336*4096),
			2*128256*4096 + 4096 + 32*(4096*(4096+1024+1024)+4096*4096+2*4096+3*14336*4096),
			8.0, 8.0, 0.05, "Meta Llama 3 model card: 8B (8.03B as HF lists it)"},
		{"llama3-70b",
			2*128256*8192 + 8192 + 80*(8192*(8192+1024+1024)+8192*8192+2*8192+3*28672*8192),
			2*128256*8192 + 8192 + 80*(8192*(8192+1024+1024)+8192*8192+2*8192+3*28672*8192),
			70, 70, 1, "Meta Llama 3 model card: 70B (70.55B counted here)"},
		{"llama3.1-405b",
			2*128256*16384 + 16384 + 126*(16384*(16384+1024+1024)+16384*16384+2*16384+3*53248*16384),
			2*128256*16384 + 16384 + 126*(16384*(16384+1024+1024)+16384*16384+2*16384+3*53248*16384),
			405, 405, 1, "Meta Llama 3.1 model card: 405B (405.85B counted here)"},
	} {
		c, err := Load(tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		total, active := countParams(c)
		if total != tc.total || active != tc.active {
			t.Errorf("%s: params %d / %d, hand closed form %d / %d", tc.name, total, active, tc.total, tc.active)
		}
		pubActive := float64(active)
		if tc.name == "glm-4.5-air" {
			// Z.ai's 12B counts neither the embedding nor the LM head
			// (13.42B with them, 12.18B without).
			pubActive -= 2 * 151552 * 4096
		}
		if d := math.Abs(float64(total)/1e9 - tc.pubTotal); d > tc.tol {
			t.Errorf("%s: total %.3fB vs published %.1fB (%s)", tc.name, float64(total)/1e9, tc.pubTotal, tc.pubSource)
		}
		actTol := tc.tol
		if tc.name == "qwen3-30b-a3b" {
			actTol = 0.06 // 3.353B: Qwen truncates to 3.3B rather than rounding
		}
		if d := math.Abs(pubActive/1e9 - tc.pubActive); d > actTol {
			t.Errorf("%s: active %.3fB vs published %.1fB (%s)", tc.name, pubActive/1e9, tc.pubActive, tc.pubSource)
		}
	}
}

func TestBuiltinStructure(t *testing.T) {
	names := Builtins()
	want := []string{"deepseek-moe-16b", "deepseek-v2-lite", "deepseek-v3", "glm-4.5-air", "gpt-oss-120b", "gpt-oss-20b", "kimi-k2", "llama-4-maverick", "llama-4-scout", "llama3-70b", "llama3-8b", "llama3.1-405b", "mixtral-8x7b", "moonlight-16b-a3b", "olmoe-1b-7b", "qwen3-235b-a22b", "qwen3-30b-a3b", "tiny", "tiny-dense"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("Builtins() = %v", names)
	}
	for _, n := range names {
		c, err := Load(n)
		if err != nil {
			t.Fatal(err)
		}
		if c.Source == "" || c.Name != n {
			t.Errorf("%s: source %q name %q", n, c.Source, c.Name)
		}
	}
	glm, _ := Load("glm-4.5-air")
	if glm.MoELayer[0] || !glm.MoELayer[1] || glm.MoELayers() != 45 || glm.Score != moe.Sigmoid || !glm.SelectionBias ||
		glm.RotaryDim() != 64 || !glm.QKVBias || glm.QKNorm != moe.QKNormNone || glm.SharedExperts != 1 || glm.SharedFFN != 1408 || glm.SharedGated {
		t.Errorf("glm-4.5-air normalized wrongly: %+v", glm)
	}
	ds, _ := Load("deepseek-moe-16b")
	if ds.MoELayer[0] || ds.MoELayers() != 27 || ds.SharedExperts != 2 || ds.SharedFFN != 1408 || ds.NormTopK ||
		ds.AuxLossCoef != 0.001 || !ds.OutputRouterLogits || ds.KVHeads != 16 || ds.HeadDim != 128 {
		t.Errorf("deepseek-moe-16b normalized wrongly: %+v", ds)
	}
	mx, _ := Load("mixtral-8x7b")
	if !mx.NormTopK || mx.DenseFFN != 0 || mx.MoELayers() != 32 || mx.AuxLossCoef != 0.02 || mx.RopeTheta != 1e6 {
		t.Errorf("mixtral normalized wrongly: %+v", mx)
	}
	ol, _ := Load("olmoe-1b-7b")
	if ol.QKNorm != moe.QKNormFull || ol.NormTopK || ol.AuxLossCoef != 0.01 {
		t.Errorf("olmoe normalized wrongly: %+v", ol)
	}
	q, _ := Load("qwen3-30b-a3b")
	if q.QKNorm != moe.QKNormHead || !q.NormTopK || q.NormEps != 1e-6 || q.OutputRouterLogits {
		t.Errorf("qwen3 normalized wrongly: %+v", q)
	}
	l405, _ := Load("llama3.1-405b")
	if l405.IsMoE() || l405.KVHeads != 8 || l405.HeadDim != 128 || l405.DenseFFN != 53248 || l405.RopeTheta != 5e5 ||
		l405.RopeScaling != "llama3" || l405.Yarn != nil || l405.TiedEmbeddings {
		t.Errorf("llama3.1-405b normalized wrongly: %+v", l405)
	}
	l70, _ := Load("llama3-70b")
	if l70.IsMoE() || l70.KVHeads != 8 || l70.HeadDim != 128 || l70.DenseFFN != 28672 || l70.RopeScaling != "" {
		t.Errorf("llama3-70b normalized wrongly: %+v", l70)
	}
	tiny, _ := Load("tiny")
	if !reflect.DeepEqual(tiny.MoELayer, []bool{false, true}) || tiny.Experts != 4 || tiny.TopK != 2 {
		t.Errorf("tiny: %+v", tiny)
	}
	td, _ := Load("tiny-dense")
	if td.IsMoE() || !td.TiedEmbeddings {
		t.Errorf("tiny-dense: %+v", td)
	}
}

// TestGPTOSSParams: GPT-OSS's parameters summed per tensor from its
// config.json by hand, with the tensors of modeling_gpt_oss.py
// (transformers 00d4b3d2) at their logical (dequantized) shapes. Per layer,
// D = 2880, q = 64·64 = 4096, kv = 8·64 = 512, F = 2880:
//
//	norms 2·D; q, k, v, o weights D·(q+2·kv) + q·D and biases q + 2·kv + D;
//	sinks 64; router E·D + E; experts E·(D·2F + 2F + F·D + D)
//
// and the embedding and LM head V·D each (untied), final norm D. The totals
// must equal the released checkpoints' per-tensor counts, 116,829,156,672
// and 20,914,757,184 (issue 40); OpenAI's model card (arXiv:2508.10925,
// table 1) gives 116.83B / 5.13B active and 20.91B / 3.61B active, its
// active count excluding the input embedding.
func TestGPTOSSParams(t *testing.T) {
	const D, V, q, kv, F = 2880, 201088, 4096, 512, 2880
	layer := func(E, k int64) int64 {
		return 2*D + D*(q+2*kv) + q*D + q + 2*kv + D + 64 + E*D + E + k*(D*2*F+2*F+F*D+D)
	}
	for _, tc := range []struct {
		name               string
		layers, experts    int64
		checkpoint         int64
		cardTotal, cardAct float64
	}{
		{"gpt-oss-120b", 36, 128, 116_829_156_672, 116.83, 5.13},
		{"gpt-oss-20b", 24, 32, 20_914_757_184, 20.91, 3.61},
	} {
		c, err := Load(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		total, active := countParams(c)
		wantTotal := 2*V*D + D + tc.layers*layer(tc.experts, tc.experts)
		wantActive := 2*V*D + D + tc.layers*layer(tc.experts, 4)
		if total != wantTotal || active != wantActive {
			t.Errorf("%s: params %d / %d, hand count %d / %d", tc.name, total, active, wantTotal, wantActive)
		}
		if total != tc.checkpoint {
			t.Errorf("%s: total %d, the checkpoint holds %d", tc.name, total, tc.checkpoint)
		}
		if d := math.Abs(float64(total)/1e9 - tc.cardTotal); d > 0.005 {
			t.Errorf("%s: total %.3fB vs model card %.2fB", tc.name, float64(total)/1e9, tc.cardTotal)
		}
		if d := math.Abs(float64(active-V*D)/1e9 - tc.cardAct); d > 0.005 {
			t.Errorf("%s: active without the input embedding %.3fB vs model card %.2fB", tc.name, float64(active-V*D)/1e9, tc.cardAct)
		}
	}
}
