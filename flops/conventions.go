package flops

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Convention names a way of counting training FLOPs.
type Convention string

// The conventions, in report order.
const (
	Torchtitan Convention = "torchtitan"
	Megatron   Convention = "megatron"
	PaLM       Convention = "palm"
	Model      Convention = "model"
	Hardware   Convention = "hardware"
)

// AllConventions returns the conventions in report order (a new slice each
// call); Torchtitan is the default MFU convention.
func AllConventions() []Convention { return []Convention{Torchtitan, Megatron, PaLM, Model, Hardware} }

// Explain says in one line how the convention differs from the others.
func (c Convention) Explain() string {
	switch c {
	case Torchtitan:
		return "6·N (N = params but input embedding, routed experts ×k/E floored; router, norms, LM head in) + 6·L·H·(d_qk+d_v)·min(s,window); causal not halved"
	case Megatron:
		return "matmuls only, SwiGLU 3 GEMMs, router/norms excluded (MLA: latent norms counted as rank-wide GEMMs), logits on vocab padded to 128, causal attention halved (3·H·(d_qk+d_v)·s² per layer), sliding windows and Llama 4's chunks ignored"
	case PaLM:
		return "6·N + 12·L·H·d·s with torchtitan's N (MLA: 6·L·H·(d_qk+d_v)·s); equals torchtitan without sliding windows"
	case Model:
		return "every matmul executed forward+backward, attention exact under the causal/window/chunk mask, no recompute"
	case Hardware:
		return "model + checkpoint recompute (--ac) + flash-attention QKᵀ recompute + attention tile waste"
	}
	return ""
}

// Totals are the FLOPs of one step (Shape.Batch sequences of Shape.Seq
// tokens) under every convention, and per token (PerStep / tokens).
type Totals struct {
	Shape    Shape
	AC       moe.AC
	Tile     Tile
	PerStep  map[Convention]int64
	PerToken map[Convention]float64
}

// Count computes every convention; hardware uses ac and tile.
func Count(cfg *moe.Config, s Shape, ac moe.AC, tile Tile) (Totals, error) {
	t := Totals{Shape: s, AC: ac, Tile: tile, PerStep: map[Convention]int64{}, PerToken: map[Convention]float64{}}
	var err error
	steps := []struct {
		c Convention
		f func() (int64, error)
	}{
		{Torchtitan, func() (int64, error) { return TorchtitanPerStep(cfg, s) }},
		{Megatron, func() (int64, error) { return MegatronPerStep(cfg, s, 128) }},
		{PaLM, func() (int64, error) { return PaLMPerStep(cfg, s) }},
		{Model, func() (int64, error) { return ModelPerStep(cfg, s) }},
		{Hardware, func() (int64, error) { return HardwarePerStep(cfg, s, ac, tile) }},
	}
	for _, st := range steps {
		if t.PerStep[st.c], err = st.f(); err != nil {
			return Totals{}, fmt.Errorf("%s: %w", st.c, err)
		}
		t.PerToken[st.c] = float64(t.PerStep[st.c]) / float64(s.Tokens())
	}
	return t, nil
}

// MatmulNParams is torchtitan's N_mm (get_moe_model_nparams_and_flops,
// torchtitan b5bcd76, 2026-08-21): every parameter but the input embedding
// (nothing subtracted when embeddings are tied, the shared matrix being the
// LM head), with the routed experts' total replaced by
// routed·top_k // experts (Python floor division of the product).
func MatmulNParams(cfg *moe.Config) (int64, error) {
	p, err := CountParams(cfg)
	if err != nil {
		return 0, err
	}
	var c checked
	routed := p.ByGroup[moe.GroupRouted]
	n := p.Total - routed
	if !cfg.TiedEmbeddings {
		n -= p.ByGroup[moe.GroupEmbedding]
	}
	if cfg.Experts > 0 {
		E, K := int64(cfg.Experts), int64(cfg.TopK)
		// ⌊routed·K/E⌋ without forming routed·K.
		n = c.add(n, c.mul(routed/E, K), c.mul(routed%E, K)/E)
	}
	return n, c.err
}

// TorchtitanPerStep is torchtitan's count for T = b·s tokens:
// T·(6·N_mm + Σ_layers 6·H·(d_qk+d_v)·min(s, window)), every layer being a
// softmax-attention layer; sliding-window layers use min(s, window) as
// shared/REFERENCES.md and issue 2 define it, and as torchtitan PR #4300
// made its gpt_oss count (issue 40). That PR is not in the pinned mirror:
// at torchtitan b5bcd76 get_moe_model_nparams_and_flops
// (torchtitan/models/utils.py) counts every layer at the training seq_len,
// gpt_oss's sliding layers included, so for the GPT-OSS built-ins (the
// only ones with windows) torchtitan b5bcd76 logs 18·6·64·128·(s − 128)
// more FLOPs per token than this count at seq s (GPT-OSS-120B). Llama 4's
// chunked layers count at the full seq_len, as torchtitan v0.2.2 (73a0e69
// models/llama4/model/args.py get_nparams_and_flops) counts them; torchtitan
// main (b5bcd76) no longer has Llama 4.
func TorchtitanPerStep(cfg *moe.Config, s Shape) (int64, error) {
	if err := checkShape(cfg, s); err != nil {
		return 0, err
	}
	n, err := MatmulNParams(cfg)
	if err != nil {
		return 0, err
	}
	var c checked
	// head_dims = d_qk + d_v: 2·head_dim for standard attention; torchtitan's
	// DeepSeekV3ModelArgs.get_nparams_and_flops passes qk_nope_head_dim +
	// qk_rope_head_dim + v_head_dim (models/deepseek_v3/model/args.py,
	// torchtitan 05c63359).
	H, dd := int64(cfg.Heads), int64(cfg.HeadDim+cfg.VHeadDim())
	var attn int64
	for _, w := range cfg.Window {
		se := int64(s.Seq)
		if w > 0 && int64(w) < se {
			se = int64(w)
		}
		attn = c.add(attn, c.mul(6, H, dd, se))
	}
	per := c.add(c.mul(6, n), attn)
	return c.mul(s.Tokens(), per), c.err
}

// PaLMPerStep is PaLM's 6N + 12·L·H·Q·s per token (Chowdhery et al. 2022,
// appendix B) with N = torchtitan's N_mm (active parameters, input
// embedding excluded, LM head included), Q = head dim; no windows. PaLM
// has one head dim; under MLA, whose q·k and v head dims differ, 12·Q is
// taken as 6·(d_qk + d_v) (2Q = the q·k and the v width), which keeps PaLM
// equal to torchtitan without windows.
func PaLMPerStep(cfg *moe.Config, s Shape) (int64, error) {
	if err := checkShape(cfg, s); err != nil {
		return 0, err
	}
	n, err := MatmulNParams(cfg)
	if err != nil {
		return 0, err
	}
	var c checked
	per := c.add(c.mul(6, n), c.mul(6, int64(cfg.Layers), int64(cfg.Heads), int64(cfg.HeadDim+cfg.VHeadDim()), int64(s.Seq)))
	return c.mul(s.Tokens(), per), c.err
}

// MegatronPerStep is Megatron-LM's num_floating_point_operations
// (megatron/training/training.py, transformer_flops, Megatron-LM d98e8a6,
// 2026-08-22) for b sequences of s tokens, T = b·s, with SwiGLU, group-query
// attention and no MTP:
//
//	T·( 6·D·(3·Fd·L_dense + 3·F·K·L_moe + 3·S·L_moe)
//	  + L·6·(D·(q + 2·kv) + q·D)
//	  + 6·D·V_pad )
//	+ b·s²·L·6·q            (causal: (6·q/2)·2 per s²)
//
// V_pad is the vocabulary rounded up to a multiple of vocabMultiple
// (make_vocab_size_divisible_by × TP; 128 by default). Router, norms,
// biases, softmax and windows are not counted.
func MegatronPerStep(cfg *moe.Config, s Shape, vocabMultiple int) (int64, error) {
	return megatron(cfg, s, vocabMultiple, 0)
}

// megatron is transformer_flops with mtp_num_layers = mtp: the MTP layers
// count as more layers of the last layer's kind (dense or MoE), each with
// its norms as 3·D and eh_proj as 2·D² matmul parameters, and the logits
// once more per MTP layer.
func megatron(cfg *moe.Config, s Shape, vocabMultiple, mtp int) (int64, error) {
	if err := checkShape(cfg, s); err != nil {
		return 0, err
	}
	if vocabMultiple < 1 {
		return 0, fmt.Errorf("vocab multiple = %d: must be ≥ 1", vocabMultiple)
	}
	var c checked
	D, T := int64(cfg.Hidden), s.Tokens()
	L, Lm := int64(cfg.Layers), int64(cfg.MoELayers())
	Ld := L - Lm
	M := int64(mtp)
	if cfg.MoELayer[cfg.Layers-1] {
		Lm += M
	} else {
		Ld += M
	}
	L += M
	q := c.mul(int64(cfg.Heads), int64(cfg.HeadDim))
	kv := c.mul(int64(cfg.KVHeads), int64(cfg.HeadDim))
	S := c.mul(int64(cfg.SharedExperts), int64(cfg.SharedFFN))
	mlp := c.mul(6, D, c.add(
		c.mul(3, int64(cfg.DenseFFN), Ld),
		c.mul(3, int64(cfg.ExpertFFN), int64(cfg.TopK), Lm),
		c.mul(3, S, Lm)))
	if Lm == 0 {
		mlp = c.mul(6, D, 3, int64(cfg.DenseFFN), Ld)
	}
	attnLin := c.mul(L, 6, c.add(c.mul(D, c.add(q, c.mul(2, kv))), c.mul(q, D)))
	core := c.mul(int64(s.Batch), int64(s.Seq), int64(s.Seq), L, 6, q)
	if cfg.IsMLA() {
		attnLin, core = megatronMLA(&c, cfg, s, L)
	}
	vm := int64(vocabMultiple)
	vpad := c.mul((int64(cfg.Vocab)+vm-1)/vm, vm)
	logits := c.mul(6, D, vpad, M+1)
	mtpTerm := c.mul(6, M, c.add(c.mul(3, D), c.mul(2, D, D)))
	linear := c.mul(T, c.add(mlp, attnLin, logits, mtpTerm))
	return c.add(linear, core), c.err
}

// megatronMLA is the multi_latent_attention branch of Megatron-LM's
// transformer_flops (megatron/training/training.py, Megatron-LM 001b00c2,
// 2026), per token for its linear part and per step for its s-dependent
// part, with Megatron's qk_head_dim = nope, qk_pos_emb_head_dim = r:
//
//	6·( q_term + Rkv·(D + H·(n+v) + 1) + D·r + H·v·D )           per token and layer
//	q_term = D·H·(n+r) without a query latent, else Rq·(D + H·(n+r) + 1)
//	6·( s·H·(n+r)/2 + s·H·v/2 )                                   per token and layer
//
// Reproduced as written, including where it departs from what the layer
// executes (moescope's model count):
//   - each latent RMSNorm is counted as a matmul of its rank (the "+ 1"
//     terms: 6·(Rq + Rkv) per token and layer that no GEMM performs);
//   - causal attention is halved as s/2 rather than (s+1)/2 of the
//     s(s+1)/2 entries a causal mask keeps;
//   - the router is not counted (as in its other branches).
//
// The halves are exact here: 6·(x/2) = 3·x. Python evaluates the /2 in
// float64, which agrees with this integer wherever the total is below 2⁵³.
func megatronMLA(c *checked, cfg *moe.Config, s Shape, L int64) (attnLin, core int64) {
	m := cfg.MLA
	D, H := int64(cfg.Hidden), int64(cfg.Heads)
	n, r, v := int64(m.Nope), int64(m.Rope), int64(m.V)
	Rq, Rkv := int64(m.QRank), int64(m.KVRank)
	q := c.mul(D, H, n+r)
	if Rq > 0 {
		q = c.mul(Rq, c.add(D, c.mul(H, n+r), 1))
	}
	lin := c.add(q, c.mul(Rkv, c.add(D, c.mul(H, n+v), 1)), c.mul(D, r), c.mul(H, v, D))
	attnLin = c.mul(L, 6, lin)
	// T·s·3·H·(n+r+v) per layer = b·s²·3·H·(n+r+v).
	core = c.mul(int64(s.Batch), int64(s.Seq), int64(s.Seq), L, 3, H, n+r+v)
	return attnLin, core
}

// ModelPerStep is moescope's model count: 2 × the Count of every matmul,
// grouped-GEMM and attention record of Ops with no checkpointing and exact
// attention, forward and both backward passes, no recompute.
func ModelPerStep(cfg *moe.Config, s Shape) (int64, error) {
	recs, err := Ops(cfg, s, moe.AC{Mode: moe.ACNone}, ExactTile)
	if err != nil {
		return 0, err
	}
	return MatmulFLOPs(recs, false)
}

// HardwarePerStep is the hardware count: 2 × the Count of every matmul,
// grouped-GEMM and attention record of Ops under ac with attention tile
// tile, recompute included (checkpointing, flash attention's QKᵀ, tile
// waste); GEMM padding is not modelled.
func HardwarePerStep(cfg *moe.Config, s Shape, ac moe.AC, tile Tile) (int64, error) {
	recs, err := Ops(cfg, s, ac, tile)
	if err != nil {
		return 0, err
	}
	return MatmulFLOPs(recs, true)
}

// MatmulFLOPs sums 2·Count over the matmul-kind records (matmul, grouped,
// attention), recompute records only when withRecompute.
func MatmulFLOPs(recs []moe.OpRecord, withRecompute bool) (int64, error) {
	var c checked
	var n int64
	for _, r := range recs {
		if r.Op.Kind() == moe.KindElementwise || (r.Pass == moe.Recompute && !withRecompute) {
			continue
		}
		n = c.add(n, r.Count)
	}
	return c.mul(2, n), c.err
}

func checkShape(cfg *moe.Config, s Shape) error {
	if cfg == nil {
		return fmt.Errorf("flops: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid config: %w", err)
	}
	return s.Validate()
}

// ParseConvention reads a convention name; an unknown one is an error
// listing the known names.
func ParseConvention(s string) (Convention, error) {
	for _, c := range AllConventions() {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("convention %q: must be one of torchtitan, megatron, palm, model, hardware", s)
}
