package cost

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// lpSpec is testSpec with round low-precision rates: an fp8 peak twice the
// bf16 one, so hand-worked times compare directly.
func lpSpec(recipe job.Precision, linear, experts, output bool) ComputeSpec {
	s := testSpec
	s.LowPrecision = &LowPrecision{Recipe: recipe, Linear: linear, Experts: experts, Output: output,
		PeakFLOPs: 2000e12, GEMMEff: 0.8, GroupedEff: 0.5, WgradRatio: 0.75, CastEff: 0.5}
	return s
}

var lpCfg = &moe.Config{Hidden: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, Experts: 8, TopK: 2, ExpertFFN: 1024, Vocab: 1000}

// A converted GEMM runs its tiles at the fp8 peak × the fp8 efficiency:
// q_proj [1024, 1024] over 4096 rows is 32·8 = 256 tiles, 2 waves of 132
// SMs = 264 slots of 2·128²·1024 FLOPs at 2000e12·0.8 = 1600 TFLOP/s
// (bf16: 800 TFLOP/s, twice the time) = 5.5 µs; operands of one byte,
// output bf16: 4096·1024 + 1024² + 2·4096·1024 = 13.6 MB at 8 TB/s (HBM at
// full efficiency here) = 1.7 µs < compute. Its forward casts x
// (4096·1024) and w (1024²) at 3 + 1/32 bytes each (mxfp8) at 8e12·0.5
// bytes/s. No launch floor.
func TestConvertedGEMMHandWorked(t *testing.T) {
	s := lpSpec(job.MXFP8, true, false, false)
	s.HBMBytesPerS, s.MemEff, s.LaunchS = 8e12, 1, 0
	rec := moe.OpRecord{Op: moe.OpQProj, Pass: moe.Forward, Count: 4096 * 1024 * 1024}
	gemm := 264 * 2 * 128 * 128 * 1024.0 / 1600e12
	cast := (4096*1024 + 1024*1024) * (3 + 1.0/32) / 4e12
	got, err := s.OpSeconds(lpCfg, rec, 1, nil)
	if err != nil || !near(got, gemm+cast, 1e-12) {
		t.Fatalf("converted q_proj: %g (%v), want %g + %g", got, err, gemm, cast)
	}
	if c := s.CastSeconds(lpCfg, rec, 1); !near(c, cast, 1e-12) {
		t.Errorf("casts: %g, want %g", c, cast)
	}
	// Unconverted: the router (never), and every linear under bf16.
	router := moe.OpRecord{Op: moe.OpRouter, Pass: moe.Forward, Count: 4096 * 8 * 1024}
	if c := s.CastSeconds(lpCfg, router, 1); c != 0 {
		t.Errorf("router casts %g, want 0 (stays bf16)", c)
	}
	bf16 := testSpec
	bf16.HBMBytesPerS, bf16.MemEff, bf16.LaunchS = 8e12, 1, 0
	bf, _ := bf16.OpSeconds(lpCfg, rec, 1, nil)
	if want := 264 * 2 * 128 * 128 * 1024.0 / 800e12; !near(bf, want, 1e-12) {
		t.Errorf("bf16 q_proj: %g, want %g", bf, want)
	}
}

// Bytes each recipe's casts move per pass, for an op of x = R·in, g =
// R·out, w = out·in elements: torchao casts two operands per GEMM
// (tensorwise: an amax read of 2 bytes, then 2 read + 1 written), TE one
// amax and one cast-transpose of 2 read + 2 written per tensor, x and w in
// forward, g in the data gradient, nothing in the weight gradient.
func TestCastBytesByRecipe(t *testing.T) {
	const R, out, in = 8192, 1024, 1024
	x, g, w := float64(R*in), float64(R*out), float64(out*in)
	bw := 4e12 * 0.5
	for _, c := range []struct {
		recipe job.Precision
		pass   moe.Pass
		bytes  float64
	}{
		{job.FP8Tensorwise, moe.Forward, (x + w) * 5},
		{job.FP8Tensorwise, moe.BackwardData, (g + w) * 5},
		{job.FP8Tensorwise, moe.BackwardWeight, (g + x) * 5},
		{job.MXFP8, moe.BackwardWeight, (g + x) * (3 + 1.0/32)},
		{job.FP8Current, moe.Forward, (x + w) * 6},
		{job.FP8Current, moe.BackwardData, g * 6},
		{job.FP8Current, moe.BackwardWeight, 0},
		// nvfp4 (TE): per tensor an amax read (2), the read (2) and two
		// copies of half a byte + 1/16 of an e4m3 scale (2·0.5625); x and
		// g also a Hadamard-amax read (2): x 7.125, w 5.125, g 7.125.
		{job.NVFP4, moe.Forward, x*7.125 + w*5.125},
		{job.NVFP4, moe.BackwardData, g * 7.125},
		{job.NVFP4, moe.BackwardWeight, 0},
		// fp8-rowwise (torchao): as tensorwise, an amax pass (per row)
		// before each of the six casts: 5 bytes per element.
		{job.FP8Rowwise, moe.Forward, (x + w) * 5},
		{job.FP8Rowwise, moe.BackwardData, (g + w) * 5},
		{job.FP8Rowwise, moe.BackwardWeight, (g + x) * 5},
		// fp8-delayed (TE): the cast-transpose alone, 2 read + 2 written,
		// its amax recorded in the same pass.
		{job.FP8Delayed, moe.Forward, (x + w) * 4},
		{job.FP8Delayed, moe.BackwardData, g * 4},
		{job.FP8Delayed, moe.BackwardWeight, 0},
		// fp8-blockwise (TE): 2 read, two 1-byte copies, each with an
		// FP32 scale per 128 elements of x and g (2·4/128 = 1/16 byte)
		// and per 128·128 of w (2·4/16384).
		{job.FP8Blockwise, moe.Forward, x*(4+1.0/16) + w*(4+8.0/16384)},
		{job.FP8Blockwise, moe.BackwardData, g * (4 + 1.0/16)},
		{job.FP8Blockwise, moe.BackwardWeight, 0},
	} {
		s := lpSpec(c.recipe, true, true, false)
		rec := moe.OpRecord{Op: moe.OpQProj, Pass: c.pass, Count: R * out * in}
		if got := s.CastSeconds(lpCfg, rec, 1); !near(got, c.bytes/bw, 1e-12) {
			t.Errorf("%s %v: %g s, want %g bytes = %g s", c.recipe, c.pass, got, c.bytes, c.bytes/bw)
		}
	}
}

// A grouped weight gradient runs at WgradRatio of the forward's rate:
// compute-bound, its time is the forward's ÷ 0.75 when the shapes tile
// alike (8 groups of 4096 rows, 1024×1024: forward 32·8·8 tiles of K =
// 1024; weight gradient 8·8·8 tiles of K = 4096, the same FLOPs).
// MX grouped GEMMs add the per-row scale rearrangement in forward and the
// data gradient, not the weight gradient.
func TestGroupedLowPrecision(t *testing.T) {
	s := lpSpec(job.MXFP8, false, true, false)
	Ms := []int64{4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}
	r := s.lowRate()
	fwd := s.groupedSeconds(Ms, 1024, 1024, moe.Forward, r)
	wg := s.groupedSeconds(Ms, 1024, 1024, moe.BackwardWeight, r)
	if !near(wg, fwd/0.75, 1e-9) {
		t.Errorf("weight gradient %g, want forward %g / 0.75", wg, fwd)
	}
	rows := int64(8 * 4096)
	rec := moe.OpRecord{Op: moe.OpExpertUp, Pass: moe.Forward, Count: rows * 1024 * 1024}
	x, w := float64(rows*1024), float64(8*1024*1024)
	want := (x+w)*(3+1.0/32)/2e12 + float64(rows)*MXSwizzleSPerRow
	if got := s.CastSeconds(lpCfg, rec, 8); !near(got, want, 1e-12) {
		t.Errorf("grouped forward casts: %g, want %g", got, want)
	}
	rec.Pass = moe.BackwardWeight
	if got, want := s.CastSeconds(lpCfg, rec, 8), 2*x*(3+1.0/32)/2e12; !near(got, want, 1e-12) {
		t.Errorf("grouped weight-gradient casts: %g, want %g (no rearrangement)", got, want)
	}
}

// torchtitan's filter converts only linears whose dims are multiples of
// 16; the output head only when asked.
func TestConvertedSets(t *testing.T) {
	cfg := *lpCfg
	cfg.Vocab = 1000 // 1000 % 16 = 8
	lp := &LowPrecision{Linear: true, Output: true}
	if lp.converts(&cfg, moe.OpLMHead, moe.Forward) {
		t.Error("head of vocabulary 1000 converted; 1000 is not a multiple of 16")
	}
	cfg.Vocab = 1024
	if !lp.converts(&cfg, moe.OpLMHead, moe.Forward) || (&LowPrecision{Linear: true}).converts(&cfg, moe.OpLMHead, moe.Forward) {
		t.Error("head converted iff output is in the set")
	}
	if lp.converts(&cfg, moe.OpExpertGate, moe.Forward) || !(&LowPrecision{Experts: true}).converts(&cfg, moe.OpExpertGate, moe.Forward) {
		t.Error("experts converted iff experts is in the set")
	}
	if (&LowPrecision{Linear: true, Experts: true, Output: true}).converts(&cfg, moe.OpAttn, moe.Forward) {
		t.Error("attention converted")
	}
}

// MX needs a device with MX formats; bf16 has no low-precision part.
func TestLowPrecisionFor(t *testing.T) {
	h100, _ := hw.LookupDevice("h100")
	b200, _ := hw.LookupDevice("b200")
	r := job.DefaultRecipe()
	if lp, err := LowPrecisionFor(b200, r); lp != nil || err != nil {
		t.Errorf("bf16: %v, %v; want nil, nil", lp, err)
	}
	r.Precision = job.MXFP8
	if _, err := LowPrecisionFor(h100, r); err == nil || !strings.Contains(err.Error(), "h100") || !strings.Contains(err.Error(), "mxfp8") {
		t.Errorf("mxfp8 on h100: %v; want an error naming device and recipe", err)
	}
	lp, err := LowPrecisionFor(b200, r)
	if err != nil || lp.PeakFLOPs != b200.MXFP8FLOPs || !lp.Linear || !lp.Experts || lp.Output {
		t.Errorf("mxfp8 on b200: %+v, %v; want the MX peak, linear and experts", lp, err)
	}
	// NVFP4 needs FP4 tensor cores: refused on Hopper naming both, priced
	// at the FP4 peak on Blackwell (9e15 on B200: twice its FP8 4.5e15).
	r.Precision = job.NVFP4
	if _, err := LowPrecisionFor(h100, r); err == nil || !strings.Contains(err.Error(), "h100") || !strings.Contains(err.Error(), "nvfp4") {
		t.Errorf("nvfp4 on h100: %v; want an error naming device and recipe", err)
	}
	if lp, err := LowPrecisionFor(b200, r); err != nil || lp.PeakFLOPs != 9e15 {
		t.Errorf("nvfp4 on b200: %+v, %v; want the FP4 peak 9e15", lp, err)
	}
}

// A calibration scales the low-precision kernels only when fitted on
// their recipe.
func TestCalibrationCoversRecipe(t *testing.T) {
	s := lpSpec(job.MXFP8, true, true, false)
	bf := &Calibration{GEMMScale: 0.5}
	if got := s.Calibrated(bf); got.LowPrecision.GEMMEff != 0.8 || got.GEMMEff != 0.4 {
		t.Errorf("bf16 fit: fp8 eff %v (want 0.8 kept), bf16 eff %v (want 0.4)", got.LowPrecision.GEMMEff, got.GEMMEff)
	}
	mx := &Calibration{Precision: job.MXFP8, GEMMScale: 0.5}
	if got := s.Calibrated(mx); got.LowPrecision.GEMMEff != 0.4 {
		t.Errorf("mxfp8 fit: fp8 eff %v, want 0.4", got.LowPrecision.GEMMEff)
	}
	if s.LowPrecision.GEMMEff != 0.8 {
		t.Error("Calibrated changed the spec it was called on")
	}
}

// With torchao's fp8 all-gather the weights arrive cast: forward casts
// only x, the data gradient casts g and transposes the fp8 weight (1 byte
// read, 1 written); the weight gradient is unchanged.
func TestCastFP8Gather(t *testing.T) {
	const R, out, in = 8192, 1024, 1024
	x, g, w := float64(R*in), float64(R*out), float64(out*in)
	s := lpSpec(job.FP8Tensorwise, true, false, false)
	s.LowPrecision.FP8Gather = true
	bw := 4e12 * 0.5
	for pass, bytes := range map[moe.Pass]float64{moe.Forward: 5 * x, moe.BackwardData: 5*g + 2*w, moe.BackwardWeight: 5 * (g + x)} {
		rec := moe.OpRecord{Op: moe.OpQProj, Pass: pass, Count: R * out * in}
		if got := s.CastSeconds(lpCfg, rec, 1); !near(got, bytes/bw, 1e-12) {
			t.Errorf("%v: %g s, want %g bytes = %g s", pass, got, bytes, bytes/bw)
		}
	}
}

// torchao's rowwise_with_gw_hp keeps a linear's weight gradient in bf16
// (no casts, the bf16 rate) and its forward and data gradient in fp8; the
// routed experts' weight gradient stays fp8 (torchao's fp8 rowwise grouped
// GEMM has no high-precision variant).
func TestRowwiseGWHP(t *testing.T) {
	s := lpSpec(job.FP8Rowwise, true, true, false)
	s.LowPrecision.WgradHP = true
	wgrad := moe.OpRecord{Op: moe.OpQProj, Pass: moe.BackwardWeight, Count: 4096 * 1024 * 1024}
	if c := s.CastSeconds(lpCfg, wgrad, 1); c != 0 {
		t.Errorf("gw_hp weight-gradient casts %g, want 0", c)
	}
	if r := s.rateOf(lpCfg, moe.OpQProj, moe.BackwardWeight); r != s.bf16Rate() {
		t.Errorf("gw_hp weight gradient at %+v, want the bf16 rate", r)
	}
	if r := s.rateOf(lpCfg, moe.OpQProj, moe.BackwardData); r != s.lowRate() {
		t.Errorf("gw_hp data gradient at %+v, want the fp8 rate", r)
	}
	if r := s.rateOf(lpCfg, moe.OpExpertGate, moe.BackwardWeight); r != s.lowRate() {
		t.Errorf("gw_hp expert weight gradient at %+v, want the fp8 rate", r)
	}
}

// Block-scaled grouped GEMMs run at the published DeepGEMM rates: 1234 of
// 1979 TFLOP/s at 4096 rows per group, so the asymptote is 1234/1979 ×
// (4096 + 406)/4096 = 0.6235 × 1.0991 = 0.6854, and the weight gradient 457/1234 = 0.3703
// of it (pytorch/ao 36027d82 blockwise_fp8_training README); dense ones at
// the device's FP8 GEMM efficiency.
func TestBlockwiseRates(t *testing.T) {
	s := lpSpec(job.FP8Blockwise, true, true, false)
	r := s.lowRate()
	if !near(r.grouped, 0.68535, 1e-4) || !near(r.wgrad, 0.37034, 1e-4) || r.gemm != 0.8 || r.operand != 1 {
		t.Errorf("blockwise rate %+v, want grouped 0.6854, wgrad 0.3703, gemm 0.8, 1-byte operands", r)
	}
}
