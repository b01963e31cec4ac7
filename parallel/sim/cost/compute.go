package cost

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/internal/stats"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// The per-op GPU time model. An op record of the vocabulary (moe.OpRecord:
// layer, op, pass, count) becomes seconds on one GPU:
//
//	GEMM (M×K by K×N, bf16): tiles = ⌈M/128⌉·⌈N/128⌉ output tiles of
//	  128×128 (the CTA tile of cuBLAS/CUTLASS BF16 kernels on Hopper and
//	  Blackwell), waves = ⌈tiles/SMs⌉; the kernel runs waves·SMs tiles of
//	  2·128·128·K FLOPs at peak·eff_gemm, or streams its operands
//	  2·(MK + KN + MN) bytes at HBM rate·eff_mem, whichever is slower:
//	  t = max(waves·SMs·2·128²·K / (peak·eff), bytes / (hbm·eff_mem), launch).
//	grouped expert GEMM: the same per expert group with m_e rows (tokens
//	  per expert), at peak·eff_grouped·m_e/(m_e + m_half), tiles summed over
//	  experts before the wave count (one grouped launch).
//	flash attention: 2·count FLOPs at peak·eff_attn_fwd (forward) or
//	  peak·eff_attn_bwd (backward and the flash backward's own recompute),
//	  the rates of the SDPA backend that runs (AttentionKernel).
//	memory-bound ops (norms, activations, RoPE, permutations, loss,
//	  optimizer): elements × bytes moved per element ÷ (hbm·eff_mem).
//	every kernel takes at least the host's launch time (LaunchS): the CPU
//	  runs ahead of the GPU while kernels are longer than it takes to issue
//	  them, and the GPU waits for the CPU where they are shorter.
//	tensor-core kernels (GEMMs, grouped GEMMs, attention) run at the
//	  clock a GPU sustains, not at the boost clock the kernel benchmarks
//	  measured: their rates × Sustained (MSMF ÷ MAMF) × the slowest GPU's
//	  share of the mean, 1 − SpeedSD·E[max of GPUs standard normals] (a
//	  step ends with an all-reduce over every rank, so each step waits for
//	  the slowest GPU; exact when each GPU's speed is fixed, as silicon and
//	  cooling differences are), less NodeSpread·E[max of Nodes standard
//	  normals] for the spread between nodes that one node's measurement
//	  does not see (NodeSpreadLoss). Memory-bound kernels keep their rate:
//	  HBM bandwidth does not follow the SM clock.
//
// M, N and K of a matmul record follow from its op's weight shape [out, in]
// and its count: forward and recompute M = count/(out·in), N = out, K = in;
// backward_data M = count/(out·in), N = in, K = out; backward_weight M =
// out, N = in, K = count/(out·in).

// OpClass groups ops by the efficiency that governs them (and that
// calibration scales).
type OpClass uint8

// Op classes, in report order.
const (
	ClassGEMM OpClass = iota
	ClassGrouped
	ClassAttention
	ClassMemoryBound
	NumOpClasses // the number of classes
)

var opClassNames = [NumOpClasses]string{"gemm", "grouped_gemm", "attention", "memory_bound"}

// String is the class's name in reports and JSON keys.
func (c OpClass) String() string {
	if c < NumOpClasses {
		return opClassNames[c]
	}
	return fmt.Sprintf("OpClass(%d)", uint8(c))
}

// OpClasses lists every class in report order.
func OpClasses() [NumOpClasses]OpClass {
	return [NumOpClasses]OpClass{ClassGEMM, ClassGrouped, ClassAttention, ClassMemoryBound}
}

// OpClassOf returns the class of op. An op of a kind the time model has no
// efficiency for is an error, not silently priced as memory-bound.
func OpClassOf(op moe.Op) (OpClass, error) {
	switch op.Kind() {
	case moe.KindMatmul:
		return ClassGEMM, nil
	case moe.KindGrouped:
		return ClassGrouped, nil
	case moe.KindAttention:
		return ClassAttention, nil
	case moe.KindElementwise:
		return ClassMemoryBound, nil
	}
	return 0, fmt.Errorf("op %s: kind %d has no op class: the time model cannot price it", op, op.Kind())
}

// ComputeSpec is what the compute model needs of a GPU, with the
// efficiencies it applies (fractions of peak in (0, 1]).
type ComputeSpec struct {
	PeakFLOPs    float64 // BF16 dense, FLOP/s
	HBMBytesPerS float64 // bytes/s
	SMs          int
	LaunchS      float64 // per kernel launch, seconds
	GEMMEff      float64 // large dense GEMMs
	GroupedEff   float64 // grouped expert GEMMs, the asymptote for many rows per expert
	// GroupedHalfRows is the rows per expert at which a grouped GEMM runs
	// at half of GroupedEff (0: the rate does not depend on them).
	GroupedHalfRows float64
	AttnFwdEff      float64 // flash attention forward
	AttnBwdEff      float64 // flash attention backward
	MemEff          float64 // fraction of HBM bandwidth memory-bound kernels reach
	// NCCLCTAs is the SMs a running NCCL kernel takes from compute that
	// overlaps it (0: none).
	NCCLCTAs int
	// Compiled says torch.compile fuses each chain of elementwise ops into
	// one kernel (BytesPerElement); false is eager PyTorch.
	Compiled bool
	// CompositeNorm says eager RMSNorm runs PyTorch's composite
	// implementation of several fp32 kernels (before 2.9; eagerBytes).
	CompositeNorm bool
	// ExpertGEMMEff, when > 0, prices routed experts as one dense cuBLAS
	// GEMM per expert at this efficiency (TransformerEngine's GroupedLinear:
	// ExpertGEMM) instead of torch._grouped_mm's GroupedEff.
	ExpertGEMMEff float64
	// FusedElementwise says an eager framework runs each elementwise op
	// of the vocabulary as one fused kernel (TransformerEngine's and
	// Megatron's fused RMSNorm, RoPE, SwiGLU and cross-entropy) rather
	// than PyTorch's decomposition.
	FusedElementwise bool
	// FusedQKV prices the q, k and v projections as one GEMM
	// (fusedQKVSeconds).
	FusedQKV bool
	// Sustained is the sustained ÷ burst tensor-core rate (hw.Kernels'
	// SustainedRatio; 0 reads as 1: burst clock).
	Sustained float64
	// SpeedSD is the relative spread of that rate across GPUs and GPUs the
	// number of them a step waits for (0 or 1: one GPU, the mean part).
	SpeedSD float64
	GPUs    int
	// NodeSpread is the relative spread of a node's speed across the
	// job's nodes beyond what SpeedSD measures inside one node, and Nodes
	// the number of nodes a step waits for (0 or 1: one node, nothing to
	// wait for): NodeSpreadShare.
	NodeSpread float64
	Nodes      int
	// LowPrecision prices the GEMMs a low-precision recipe converts and
	// their quantize kernels (nil: every GEMM in bf16).
	LowPrecision *LowPrecision
}

// Clock is the fraction of the measured (burst) tensor-core rates the
// slowest GPU of the job sustains.
func (c ComputeSpec) Clock() float64 {
	return scaleOr1(c.Sustained) * (SlowestShare(c.SpeedSD, c.GPUs) - NodeSpreadLoss(c.NodeSpread, c.Nodes))
}

// SustainedRatio is the sustained ÷ burst tensor-core rate the spec
// prices at (Sustained; 0 reads as 1).
func (c ComputeSpec) SustainedRatio() float64 { return scaleOr1(c.Sustained) }

// SlowestShare is the expected speed of the slowest of n GPUs whose speeds
// are normal with mean 1 and relative standard deviation sd:
// 1 − sd·E[max of n standard normals].
func SlowestShare(sd float64, n int) float64 {
	if n <= 1 || sd <= 0 {
		return 1
	}
	return 1 - sd*stats.ExpectedMaxNormal(n)
}

// Validate checks every field.
func (c ComputeSpec) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"peak_flops", c.PeakFLOPs}, {"hbm_bytes_per_s", c.HBMBytesPerS}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("compute: %s = %v must be a finite number > 0", f.name, f.v)
		}
	}
	if c.SMs < 1 {
		return fmt.Errorf("compute: sms = %d must be ≥ 1", c.SMs)
	}
	if !(c.GroupedHalfRows >= 0) || math.IsInf(c.GroupedHalfRows, 0) {
		return fmt.Errorf("compute: grouped_half_rows = %v must be a finite number ≥ 0", c.GroupedHalfRows)
	}
	if !(c.Sustained >= 0 && c.Sustained <= 1) {
		return fmt.Errorf("compute: sustained = %v must be in [0, 1] (0 = the burst clock)", c.Sustained)
	}
	if !(c.SpeedSD >= 0 && c.SpeedSD <= hw.MaxSpeedSD) {
		return fmt.Errorf("compute: speed_sd = %v must be in [0, %v]", c.SpeedSD, hw.MaxSpeedSD)
	}
	if c.GPUs < 0 || c.GPUs > job.MaxDegree {
		return fmt.Errorf("compute: gpus = %d must be in [0, %d]", c.GPUs, job.MaxDegree)
	}
	if !(c.NodeSpread >= 0 && c.NodeSpread <= hw.MaxSpeedSD) {
		return fmt.Errorf("compute: node_spread = %v must be in [0, %v]", c.NodeSpread, hw.MaxSpeedSD)
	}
	if c.Nodes < 0 || c.Nodes > max(c.GPUs, 1) {
		return fmt.Errorf("compute: nodes = %d must be in [0, gpus = %d]", c.Nodes, c.GPUs)
	}
	if c.NCCLCTAs < 0 || c.NCCLCTAs >= c.SMs {
		return fmt.Errorf("compute: nccl_ctas = %d must be in [0, sms = %d)", c.NCCLCTAs, c.SMs)
	}
	if !(c.LaunchS >= 0) || math.IsInf(c.LaunchS, 0) {
		return fmt.Errorf("compute: launch_s = %v must be a finite number ≥ 0", c.LaunchS)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"gemm_eff", c.GEMMEff}, {"grouped_eff", c.GroupedEff}, {"attn_fwd_eff", c.AttnFwdEff},
		{"attn_bwd_eff", c.AttnBwdEff}, {"mem_eff", c.MemEff}} {
		if !(f.v > 0 && f.v <= 1) {
			return fmt.Errorf("compute: %s = %v must be in (0, 1]", f.name, f.v)
		}
	}
	if lp := c.LowPrecision; lp != nil {
		if !(lp.PeakFLOPs > 0) || math.IsInf(lp.PeakFLOPs, 0) {
			return fmt.Errorf("compute: low-precision peak_flops = %v must be a finite number > 0", lp.PeakFLOPs)
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"fp8_gemm_eff", lp.GEMMEff}, {"fp8_grouped_eff", lp.GroupedEff}, {"fp8_grouped_wgrad_ratio", lp.WgradRatio}, {"cast_eff", lp.CastEff}} {
			if !(f.v > 0 && f.v <= 1) {
				return fmt.Errorf("compute: %s = %v must be in (0, 1]", f.name, f.v)
			}
		}
	}
	if !(c.ExpertGEMMEff >= 0 && c.ExpertGEMMEff <= 1) {
		return fmt.Errorf("compute: expert_gemm_eff = %v must be in [0, 1] (0 = torch._grouped_mm)", c.ExpertGEMMEff)
	}
	return nil
}

// Calibrated returns the spec with calibration's multipliers applied to the
// class efficiencies, each capped at 1.
func (c ComputeSpec) Calibrated(cal *Calibration) ComputeSpec {
	if cal == nil {
		return c
	}
	all := scaleOr1(cal.ComputeScale)
	c.GEMMEff = math.Min(1, c.GEMMEff*all*scaleOr1(cal.GEMMScale))
	c.GroupedEff = math.Min(1, c.GroupedEff*all*scaleOr1(cal.GroupedScale))
	c.ExpertGEMMEff = math.Min(1, c.ExpertGEMMEff*all*scaleOr1(cal.GroupedScale))
	c.AttnFwdEff = math.Min(1, c.AttnFwdEff*all*scaleOr1(cal.AttentionScale))
	c.AttnBwdEff = math.Min(1, c.AttnBwdEff*all*scaleOr1(cal.AttentionScale))
	c.MemEff = math.Min(1, c.MemEff*all*scaleOr1(cal.MemoryBoundScale))
	if lp := c.LowPrecision; lp != nil && cal.Covers(lp.Recipe) {
		// The low-precision kernels take the calibration only when it was
		// fitted on runs of their recipe: a bf16 fit measured other kernels.
		scaled := *lp
		scaled.GEMMEff = math.Min(1, lp.GEMMEff*all*scaleOr1(cal.GEMMScale))
		scaled.GroupedEff = math.Min(1, lp.GroupedEff*all*scaleOr1(cal.GroupedScale))
		scaled.CastEff = math.Min(1, lp.CastEff*all*scaleOr1(cal.MemoryBoundScale))
		c.LowPrecision = &scaled
	}
	return c
}

const gemmTile = 128

// GEMMSeconds models one dense bf16 GEMM of M×K by K×N.
func (c ComputeSpec) GEMMSeconds(M, N, K int64) float64 { return c.gemmSeconds(M, N, K, c.bf16Rate()) }

func (c ComputeSpec) gemmSeconds(M, N, K int64, r rate) float64 {
	if M <= 0 || N <= 0 || K <= 0 {
		return 0
	}
	tiles := ceilDiv(M, gemmTile) * ceilDiv(N, gemmTile)
	// Operands at r.operand bytes, the output in bf16.
	bytes := r.operand*float64(M*K+K*N) + 2*float64(M*N)
	return c.tiledSeconds(float64(tiles)*float64(K), tiles, r.peak*r.gemm, bytes)
}

// GroupedSeconds models one grouped bf16 GEMM: for each group e, Ms[e]×K
// by K×N (forward and backward_data shapes), or with weightGrad the
// per-expert weight gradient N_out×N by the group's rows (K = Ms[e]).
func (c ComputeSpec) GroupedSeconds(Ms []int64, out, in int64, pass moe.Pass) float64 {
	return c.groupedSeconds(Ms, out, in, pass, c.bf16Rate())
}

func (c ComputeSpec) groupedSeconds(Ms []int64, out, in int64, pass moe.Pass, r rate) float64 {
	var tileK float64 // Σ tiles·K / (the group's efficiency relative to the grouped rate)
	var tiles, groups int64
	var bytes float64
	for _, m := range Ms {
		if m <= 0 {
			continue
		}
		groups++
		var M, N, K int64
		switch pass {
		case moe.BackwardData:
			M, N, K = m, in, out
		case moe.BackwardWeight:
			M, N, K = out, in, m
		default:
			M, N, K = m, out, in
		}
		t := ceilDiv(M, gemmTile) * ceilDiv(N, gemmTile)
		tiles += t
		bytes += r.operand*float64(M*K+K*N) + 2*float64(M*N)
		if r.expert > 0 {
			tileK += float64(t) * float64(K)
			continue
		}
		// A group of m rows runs at m/(m + m_half) of the asymptotic rate.
		tileK += float64(t) * float64(K) * (float64(m) + c.GroupedHalfRows) / float64(m)
	}
	if tiles == 0 {
		return 0
	}
	if r.expert > 0 {
		// One cuBLAS GEMM per expert, launched on a pool of streams that
		// run them side by side: the tiles of all share the SMs' waves, at
		// the dense rate, and the host launches each.
		return math.Max(c.tiledSeconds(tileK, tiles, r.peak*r.expert, bytes), float64(groups)*c.LaunchS)
	}
	eff := r.grouped
	if pass == moe.BackwardWeight {
		eff *= r.wgrad
	}
	return c.tiledSeconds(tileK, tiles, r.peak*eff, bytes)
}

// tiledSeconds: tileK = Σ tiles·K over the launch, padded up to whole waves
// of SMs tiles, at rate FLOP/s (peak × efficiency) before the clock.
func (c ComputeSpec) tiledSeconds(tileK float64, tiles int64, rate, bytes float64) float64 {
	waves := ceilDiv(tiles, int64(c.SMs))
	quant := float64(waves*int64(c.SMs)) / float64(tiles)
	flops := 2 * gemmTile * gemmTile * tileK * quant
	tc := flops / (rate * c.Clock())
	tm := bytes / (c.HBMBytesPerS * c.MemEff)
	return math.Max(math.Max(tc, tm), c.LaunchS)
}

// MemorySeconds models a memory-bound kernel moving bytes.
func (c ComputeSpec) MemorySeconds(bytes float64) float64 {
	if bytes <= 0 {
		return 0
	}
	return math.Max(bytes/(c.HBMBytesPerS*c.MemEff), c.LaunchS)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// weightShape returns [out, in] of a matmul or grouped op of cfg.
func weightShape(cfg *moe.Config, op moe.Op) (out, in int64, ok bool) {
	D := int64(cfg.Hidden)
	q := int64(cfg.Heads) * int64(cfg.HeadDim)
	kv := int64(cfg.KVHeads) * int64(cfg.HeadDim)
	S := int64(cfg.SharedExperts) * int64(cfg.SharedFFN)
	switch op {
	case moe.OpQProj:
		return q, D, true
	case moe.OpKProj, moe.OpVProj:
		return kv, D, true
	case moe.OpOProj:
		return D, int64(cfg.Heads) * int64(cfg.VHeadDim()), true
	case moe.OpQAProj:
		return int64(cfg.MLA.QRank), D, true
	case moe.OpQBProj:
		return q, int64(cfg.MLA.QRank), true
	case moe.OpKVAProj:
		return int64(cfg.MLA.KVRank + cfg.MLA.Rope), D, true
	case moe.OpKVBProj:
		return int64(cfg.Heads) * int64(cfg.MLA.Nope+cfg.MLA.V), int64(cfg.MLA.KVRank), true
	case moe.OpRouter:
		return int64(cfg.Experts), D, true
	case moe.OpSharedGate, moe.OpSharedUp:
		return S, D, true
	case moe.OpSharedDown:
		return D, S, true
	case moe.OpSharedExpGate:
		return 1, D, true
	case moe.OpDenseGate, moe.OpDenseUp:
		return int64(cfg.DenseFFN), D, true
	case moe.OpDenseDown:
		return D, int64(cfg.DenseFFN), true
	case moe.OpLMHead:
		return int64(cfg.Vocab), D, true
	case moe.OpExpertGate, moe.OpExpertUp:
		return int64(cfg.ExpertFFN), D, true
	case moe.OpExpertDown:
		return D, int64(cfg.ExpertFFN), true
	}
	return 0, 0, false
}

// OpSeconds models one op record on one GPU. groups gives the relative
// row counts of the local expert groups for grouped GEMMs (nil: the record's
// rows spread evenly over localExperts groups). An op of no known class
// (OpClassOf) is an error.
func (c ComputeSpec) OpSeconds(cfg *moe.Config, rec moe.OpRecord, localExperts int, groups []float64) (float64, error) {
	cls, err := OpClassOf(rec.Op)
	if err != nil || rec.Count <= 0 {
		return 0, err
	}
	switch cls {
	case ClassGEMM, ClassGrouped:
		return c.matmulSeconds(cfg, rec, localExperts, groups) + c.CastSeconds(cfg, rec, localExperts), nil
	case ClassAttention:
		eff := c.AttnFwdEff
		if rec.Pass != moe.Forward {
			eff = c.AttnBwdEff
		}
		return math.Max(2*float64(rec.Count)/(c.PeakFLOPs*eff*c.Clock()), c.LaunchS), nil
	}
	return c.MemorySeconds(float64(rec.Count) * c.BytesPerElement(rec.Op, rec.Pass)), nil
}

// matmulSeconds prices a dense or grouped matmul record at the rate its op
// runs at (rateOf), without its quantize kernels.
func (c ComputeSpec) matmulSeconds(cfg *moe.Config, rec moe.OpRecord, localExperts int, groups []float64) float64 {
	r := c.rateOf(cfg, rec.Op, rec.Pass)
	if c.FusedQKV {
		if t, ok := c.fusedQKVSeconds(cfg, rec, r); ok {
			return t
		}
	}
	out, in, ok := weightShape(cfg, rec.Op)
	if !ok || out*in == 0 {
		return math.Max(2*float64(rec.Count)/(r.peak*r.gemm*c.Clock()), c.LaunchS)
	}
	rows := rec.Count / (out * in)
	if rec.Op.Kind() == moe.KindGrouped {
		return c.groupedSeconds(splitRows(rows, localExperts, groups), out, in, rec.Pass, r)
	}
	switch rec.Pass {
	case moe.BackwardData:
		return c.gemmSeconds(rows, in, out, r)
	case moe.BackwardWeight:
		return c.gemmSeconds(out, in, rows, r)
	}
	return c.gemmSeconds(rows, out, in, r)
}

// splitRows divides rows over n groups in proportion to weights (evenly
// when weights is nil, of the wrong length or sums to zero; negative
// weights count as zero), rounding so that the parts sum to rows.
func splitRows(rows int64, n int, weights []float64) []int64 {
	if n < 1 {
		n = 1
	}
	out := make([]int64, n)
	var sum float64
	for _, w := range weights {
		if w > 0 {
			sum += w
		}
	}
	if len(weights) != n || !(sum > 0) || math.IsInf(sum, 0) {
		for i := range out {
			out[i] = rows / int64(n)
			if int64(i) < rows%int64(n) {
				out[i]++
			}
		}
		return out
	}
	var used int64
	for i, w := range weights {
		if w > 0 {
			out[i] = int64(math.Floor(float64(rows) * w / sum))
		}
		used += out[i]
	}
	for i := 0; used < rows; i = (i + 1) % n {
		out[i]++
		used++
	}
	return out
}
