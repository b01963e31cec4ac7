package main

import (
	"encoding/json"
	"testing"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
)

// TestFlopsJSONMLABuiltins runs `moescope flops --json --seq 4096` on the
// four DeepSeek-V3-family built-ins and checks its parameters against a
// per-tensor count written out by hand from each config.json, and its
// torchtitan and Megatron FLOPs per token against those conventions'
// formulas evaluated by hand (REFERENCES.md; torchtitan's deepseek_v3 args
// at 05c63359 take head_dims = d_qk + d_v = 192 + 128; Megatron-LM's
// transformer_flops MLA branch at 001b00c2). Every built-in has
// qk_nope = v = 128, qk_rope = 64, kv_lora_rank 512, untied embeddings, a
// vocabulary that is a multiple of 128 (Megatron pads nothing) and routed
// totals that k/E divides exactly (torchtitan's floor changes nothing).
//
//	per layer: attention matmuls q + 576·D + H·256·512 + D·H·128, with
//	           q = Rq·D + H·192·Rq (query latent) or D·H·192 (q_proj);
//	           norms 2·D + Rq + 512
//	active    = 2·V·D + D + L·(attn + norms) + L_d·3·F_d·D + L_m·(E·D + K·3·F·D + 3·F_s·D)
//	total     = the same with E experts in place of K
//	torchtitan = 6·(active − V·D) + 6·L·H·(192+128)·s
//	megatron   = 6·D·(3·F·K·L_m + 3·F_d·L_d + 3·F_s·L_m) + 6·L·(q′ + 512·(D + H·256 + 1) + 64·D + H·128·D)
//	             + 6·D·V + 3·L·H·320·s, q′ = Rq·(D + H·192 + 1) or D·H·192
func TestFlopsJSONMLABuiltins(t *testing.T) {
	const s = 4096
	for _, m := range []struct {
		name                                    string
		V, D, H, Rq, L, Ld, Fd, Lm, E, K, F, Fs int64
	}{
		{"deepseek-v3", 129280, 7168, 128, 1536, 61, 3, 18432, 58, 256, 8, 2048, 2048},
		{"kimi-k2", 163840, 7168, 64, 1536, 61, 1, 18432, 60, 384, 8, 2048, 2048},
		{"deepseek-v2-lite", 102400, 2048, 16, 0, 27, 1, 10944, 26, 64, 6, 1408, 2816},
		{"moonlight-16b-a3b", 163840, 2048, 16, 0, 27, 1, 11264, 26, 64, 6, 1408, 2816},
	} {
		V, D, H, Rq, L := m.V, m.D, m.H, m.Rq, m.L
		q, qMeg := D*H*192, D*H*192
		if Rq > 0 {
			q, qMeg = Rq*D+H*192*Rq, Rq*(D+H*192+1)
		}
		attn := q + 576*D + H*256*512 + D*H*128
		norms := 2*D + Rq + 512
		base := 2*V*D + D + L*(attn+norms) + m.Ld*3*m.Fd*D
		active := base + m.Lm*(m.E*D+m.K*3*m.F*D+3*m.Fs*D)
		total := base + m.Lm*(m.E*D+m.E*3*m.F*D+3*m.Fs*D)
		tt := 6*(active-V*D) + 6*L*H*320*s
		meg := 6*D*(3*m.F*m.K*m.Lm+3*m.Fd*m.Ld+3*m.Fs*m.Lm) + 6*L*(qMeg+512*(D+H*256+1)+64*D+H*128*D) + 6*D*V + 3*L*H*320*s

		out, err := runCmd(t, "flops", "--model", m.name, "--seq", "4096", "--json")
		if err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		var r report.Flops
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		if r.Params.Total != total || r.Params.Active != active {
			t.Errorf("%s: params %d / %d, by hand %d / %d", m.name, r.Params.Total, r.Params.Active, total, active)
		}
		if got := r.FLOPsPerToken[flops.Torchtitan]; got != float64(tt) {
			t.Errorf("%s: torchtitan %.6g FLOPs per token, by hand %d", m.name, got, tt)
		}
		if got := r.FLOPsPerToken[flops.Megatron]; got != float64(meg) {
			t.Errorf("%s: megatron %.6g FLOPs per token, by hand %d", m.name, got, meg)
		}
	}
}
