package moe

// The op vocabulary shared by the reference implementation (which records
// what it runs and keeps), the flops package (which counts it analytically)
// and the memory package (which sizes what is kept). One name per op, one
// meaning per count field; the analytic tables and the recordings must match
// exactly (integers), keyed by (Layer, Op, Pass).

// Counting rules (T tokens of the micro-batch, D hidden, q = H·d, kv = G·d,
// r = rotary dims, E experts, K top-k, F expert FFN, S = shared width
// SharedExperts·SharedFFN, Fd dense FFN, V vocabulary):
//
// Matmul ops (linear y = x·Wᵀ with M = T rows, N outputs, K inputs; biases are
// part of the op and not counted): forward, backward_data (dx) and
// backward_weight (dW) each Count M·N·K. Grouped expert GEMMs: Σ_e M_e·N·K per
// pass, Σ_e M_e = T·K (dropless), so the count does not depend on routing.
//
// Attention (per sequence, per query head, n = score entries executed, d_qk
// the q·k head dim and d_v the value head dim, both d = HeadDim outside MLA):
// forward n·(d_qk + d_v) (QKᵀ and PV); backward_data 2·n·(d_qk + d_v) (dP =
// dO·Vᵀ and dV = Pᵀ·dO of d_v, dQ = dS·K and dK = dSᵀ·Q of d_qk); the flash
// backward's own recomputation of QKᵀ is a Recompute record of n·d_qk. n is the exact count under the mask (causal s(s+1)/2, windows
// exact) when the tile is 1×1; with Br×Bc tiles, clipped to the sequence, n is
// the area of every tile holding at least one unmasked entry.
//
// Elementwise ops (Count = elements written):
//
//	op                          forward     backward_data  backward_weight
//	embed                       T·D         —              T·D
//	attn_norm ffn_norm final_norm T·D       T·D            T·D
//	q_norm                      T·q         T·q            T·q
//	k_norm                      T·kv        T·kv           T·kv
//	rope                        T·(H+G)·r   T·(H+G)·r      —   (MLA: T·(H+1)·r, one shared rotated key)
//	q_a_norm (MLA)              T·Rq        T·Rq           T·Rq
//	kv_a_norm (MLA)             T·Rkv       T·Rkv          T·Rkv
//	residual (both adds)        2·T·D       —              —
//	router_topk                 T·E         T·E            —
//	dispatch                    T·K·D       T·K·D          —
//	expert_act                  T·K·F       T·K·F          —
//	combine                     T·K·D       T·K·D          —
//	shared_act                  T·S         T·S            —
//	shared_scale (gated only)   T·D         T·D            —
//	mlp_act                     T·Fd        T·Fd           —
//	loss                        T·V         T·V            —
//	aux_loss (when computed)    T·E         T·E            —   per MoE layer
//
// Recompute records repeat the forward Count of every op that checkpointing
// re-executes in backward (the policy decides which; see AC).

// Op names one operation of the model's graph.
type Op string

// OpKind says how an op's work is counted.
type OpKind uint8

// Op kinds.
const (
	// KindMatmul: a GEMM of M×K by K×N; Count = M·N·K, matmul FLOPs = 2·Count.
	KindMatmul OpKind = iota
	// KindGrouped: one GEMM per routed expert over its ragged token group;
	// Count = Σ_e M_e·N·K, matmul FLOPs = 2·Count.
	KindGrouped
	// KindAttention: the score (QKᵀ) and value (PV) products; Count = the
	// multiply-adds actually performed or modelled, matmul FLOPs = 2·Count.
	KindAttention
	// KindElementwise: non-matmul work; Count = elements processed.
	KindElementwise
)

// The ops. Layer-scoped ops carry the decoder layer index; embedding carries
// LayerEmbed and final norm, LM head and loss carry LayerHead.
const (
	OpEmbed Op = "embed" // gather rows of the embedding

	OpAttnNorm Op = "attn_norm" // input RMSNorm
	OpQProj    Op = "q_proj"
	OpKProj    Op = "k_proj"
	OpVProj    Op = "v_proj"
	OpQNorm    Op = "q_norm"
	OpKNorm    Op = "k_norm"
	OpRoPE     Op = "rope"
	OpAttn     Op = "attention" // softmax(QKᵀ/√d + mask)·V, flash-style
	OpOProj    Op = "o_proj"

	// Multi-head latent attention (mla.go) instead of q/k/v_proj and QK-norm.
	OpQAProj   Op = "q_a_proj"  // D → q_lora_rank
	OpQANorm   Op = "q_a_norm"  // RMSNorm of the query latent
	OpQBProj   Op = "q_b_proj"  // q_lora_rank → H·(nope+rope)
	OpKVAProj  Op = "kv_a_proj" // D → kv_lora_rank + rope (kv_a_proj_with_mqa)
	OpKVANorm  Op = "kv_a_norm" // RMSNorm of the key-value latent
	OpKVBProj  Op = "kv_b_proj" // kv_lora_rank → H·(nope+v)
	OpResidual Op = "residual"  // both residual adds of a block

	OpFFNNorm Op = "ffn_norm" // post-attention RMSNorm

	OpRouter     Op = "router"      // router-gate linear D → E
	OpRouterTopK Op = "router_topk" // scores, (grouped) top-k, renormalization, scaling
	OpDispatch   Op = "dispatch"    // permute token rows into expert order
	OpExpertGate Op = "expert_gate" // grouped GEMM, D → F
	OpExpertUp   Op = "expert_up"   // grouped GEMM, D → F
	OpExpertAct  Op = "expert_act"  // silu(gate)·up
	OpExpertDown Op = "expert_down" // grouped GEMM, F → D
	OpCombine    Op = "combine"     // weighted sum of each token's K expert outputs

	OpSharedGate    Op = "shared_gate_proj"
	OpSharedUp      Op = "shared_up_proj"
	OpSharedAct     Op = "shared_act"
	OpSharedDown    Op = "shared_down_proj"
	OpSharedExpGate Op = "shared_expert_gate" // Qwen2-MoE: σ(x·w) scaling of the shared output
	OpSharedScale   Op = "shared_scale"       // Qwen2-MoE: multiply the shared output by σ(x·w) (elementwise)
	OpDenseGate     Op = "mlp_gate_proj"
	OpDenseUp       Op = "mlp_up_proj"
	OpDenseAct      Op = "mlp_act"
	OpDenseDown     Op = "mlp_down_proj"
	OpFinalNorm     Op = "final_norm"
	OpLMHead        Op = "lm_head"
	OpLoss          Op = "loss" // log-softmax and cross-entropy over the vocabulary
	OpAuxLoss       Op = "aux_loss"
	OpOptimizer     Op = "optimizer" // AdamW update, elements = parameters updated
	LayerEmbed         = -1
)

// LayerHead returns the layer index used for final norm, LM head and loss.
func (c *Config) LayerHead() int { return c.Layers }

// Kind returns how op's work is counted.
func (o Op) Kind() OpKind {
	switch o {
	case OpQProj, OpKProj, OpVProj, OpOProj, OpQAProj, OpQBProj, OpKVAProj, OpKVBProj, OpRouter, OpSharedGate, OpSharedUp, OpSharedDown,
		OpSharedExpGate, OpDenseGate, OpDenseUp, OpDenseDown, OpLMHead:
		return KindMatmul
	case OpExpertGate, OpExpertUp, OpExpertDown:
		return KindGrouped
	case OpAttn:
		return KindAttention
	}
	return KindElementwise
}

// Pass is the phase an op runs in.
type Pass uint8

// Passes.
const (
	Forward        Pass = iota
	BackwardData        // gradients with respect to inputs
	BackwardWeight      // gradients with respect to weights
	Recompute           // forward work repeated in backward (checkpointing, flash-attention backward)
)

var passNames = [...]string{"forward", "backward_data", "backward_weight", "recompute"}

func (p Pass) String() string {
	if int(p) < len(passNames) {
		return passNames[p]
	}
	return "pass?"
}

// MarshalText writes the pass name (JSON keys and values).
func (p Pass) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// OpRecord is one op execution (or its analytic count).
type OpRecord struct {
	Layer int   // decoder layer; LayerEmbed or LayerHead outside blocks
	Op    Op    // what ran
	Pass  Pass  // when it ran
	Count int64 // M·N·K for matmuls and grouped GEMMs, multiply-adds for attention, elements otherwise
}

// DType is a storage element type.
type DType string

// Storage types.
const (
	F32  DType = "f32"
	BF16 DType = "bf16"
	F16  DType = "f16"
	I64  DType = "i64" // token ids and expert indices as PyTorch keeps them
	I32  DType = "i32"
	Bool DType = "bool"
	// F8 is an 8-bit float (E4M3 or E5M2) and E8M0 an 8-bit power-of-two
	// scale (MXFP8's per-block scale): the quantized tensors
	// TransformerEngine saves, kept only in the memory package's tables.
	F8   DType = "f8"
	E8M0 DType = "e8m0"
)

// Bytes is the size of one element.
func (t DType) Bytes() int64 {
	switch t {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	case I64:
		return 8
	case Bool, F8, E8M0:
		return 1
	}
	return 0
}

// Saved names a tensor kept from forward for backward within the op whose
// backward reads it (SavedRecord.Tensor): the table in saved.go says which
// op keeps which. The names follow PyTorch's where it has one (the
// arguments and results of the op's derivative formula).
type Saved string

// The saved-tensor names. Records, labels and JSON print these strings.
const (
	SavedInput  Saved = "input"  // the op's input (a linear's, a norm's, the down projection's)
	SavedOutput Saved = "output" // the op's output (selective checkpointing's cached linears, attention)
	SavedIDs    Saved = "ids"    // the embedding's token ids (i64)
	SavedRstd   Saved = "rstd"   // an RMSNorm's reciprocal root mean square per row (f32)
	// Attention: flash attention's query, key and value, and the log-sum-exp
	// per query row and head (f32).
	SavedQ   Saved = "q"
	SavedK   Saved = "k"
	SavedV   Saved = "v"
	SavedLSE Saved = "lse"
	// Router and dispatch: the scores [T,E] (f32), the top-k expert indices
	// (i64), the top-k values and their sum (renormalizing routers, f32) and
	// the dispatch's row order (i64).
	SavedScores      Saved = "scores"
	SavedIndices     Saved = "indices"
	SavedValues      Saved = "values"
	SavedDenominator Saved = "denominator"
	SavedOrder       Saved = "order"
	// SwiGLU: the gate projection's output, silu of it and the up
	// projection's output.
	SavedGate     Saved = "gate"
	SavedSiLUGate Saved = "silu_gate"
	SavedUp       Saved = "up"
	// Combine: the routed experts' output rows and the routing weights
	// (f32); Qwen2-MoE's shared scale: the shared experts' output.
	SavedExpertOutput Saved = "expert_output"
	SavedWeights      Saved = "weights"
	SavedSharedOutput Saved = "shared_output"
	// Loss: the log-probabilities (f32) and the labels (i64).
	SavedLogProbs Saved = "log_probs"
	SavedLabels   Saved = "labels"
	// SavedTPReduceScatterOutput is a sequence-parallel reduce-scatter's
	// output, which torchtitan's selective policy keeps (tensor parallelism).
	SavedTPReduceScatterOutput Saved = "tp_reduce_scatter_output"
	// Kept only in the memory package's tables of what the reference does
	// not execute: an expert-parallel all-to-all's output under the
	// selective policy, eager attention's probabilities, a compiled
	// loss's logits and the attention-sink scale AutoModel's GPT-OSS
	// applies outside flex attention (f32, per head and token).
	SavedAllToAllOutput Saved = "all_to_all_output"
	SavedProbs          Saved = "probs"
	SavedLogits         Saved = "logits"
	SavedSinkScale      Saved = "sink_scale"
	// SavedScales is a quantized saved input's block scales
	// (TransformerEngine's MXFP8 tensors, E8M0).
	SavedScales Saved = "scales"
)

// SavedRecord is one tensor kept from forward for backward.
type SavedRecord struct {
	Layer    int
	Op       Op    // the op whose backward needs it
	Tensor   Saved // what it is
	Elements int64
	DType    DType // storage type under the precision policy, not the CPU's float32
}

// Bytes is Elements × the dtype size.
func (s SavedRecord) Bytes() int64 { return s.Elements * s.DType.Bytes() }

// Recorder receives what the reference implementation runs and keeps.
// A nil Recorder costs nothing.
type Recorder interface {
	RecordOp(OpRecord)
	RecordSaved(SavedRecord)
}
