package cost

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// testSpec is an H100-like spec with round efficiencies so the expected
// values below can be worked by hand.
var testSpec = ComputeSpec{PeakFLOPs: 1000e12, HBMBytesPerS: 4e12, SMs: 132, LaunchS: 5e-6,
	GEMMEff: 0.8, GroupedEff: 0.5, AttnFwdEff: 0.5, AttnBwdEff: 0.25, MemEff: 0.5}

func TestGEMMSecondsHandWorked(t *testing.T) {
	s := testSpec
	// 4096³: 32·32 = 1024 tiles, ⌈1024/132⌉ = 8 waves = 1056 tile slots of
	// 2·128²·4096 FLOPs at 800 TFLOP/s; bytes 2·3·4096² = 100.7 MB at 2 TB/s = 50 µs < compute.
	want := 1056 * 2 * 128 * 128 * 4096.0 / 800e12
	if got := s.GEMMSeconds(4096, 4096, 4096); !near(got, want, 1e-12) {
		t.Errorf("4096³: %g, want %g", got, want)
	}
	// 4097 rows add a row of 32 tiles: 1056 tiles → still 8 waves: same time.
	if got := s.GEMMSeconds(4097, 4096, 4096); !near(got, want, 1e-12) {
		t.Errorf("4097×4096×4096: %g, want %g (same wave count)", got, want)
	}
	// M = 1, N = K = 8192: 64 tiles in one wave of 132 slots: 132·2·128²·8192/800e12 = 44.3 µs;
	// bytes 2·(8192 + 8192² + 8192) = 134.25 MB at 2 TB/s = 67.1 µs → memory-bound.
	wantMem := 2 * (8192 + 8192*8192 + 8192.0) / 2e12
	if got := s.GEMMSeconds(1, 8192, 8192); !near(got, wantMem, 1e-12) {
		t.Errorf("GEMV: %g, want %g", got, wantMem)
	}
}

// A kernel shorter than a host launch takes the launch: the GPU waits for
// the CPU (a 128³ GEMM fills one tile, priced as a wave of 132 slots:
// 132·2·128³/800e12 = 0.69 µs < 5 µs).
func TestLaunchFloor(t *testing.T) {
	if got := testSpec.GEMMSeconds(128, 128, 128); got != 5e-6 {
		t.Errorf("128³ GEMM: %g, want the 5 µs launch", got)
	}
	if got := testSpec.MemorySeconds(1e3); got != 5e-6 {
		t.Errorf("1 kB copy: %g, want the 5 µs launch", got)
	}
}

// Rows per expert slow a grouped GEMM by (m + m_half)/m: 512 rows with
// m_half = 512 run at half the rate, twice the balanced time below.
func TestGroupedHalfRows(t *testing.T) {
	s := testSpec
	s.GroupedHalfRows = 512
	Ms := []int64{512, 512, 512, 512, 512, 512, 512, 512}
	want := 2 * 264 * 2 * 128 * 128 * 1024.0 / 500e12
	if got := s.GroupedSeconds(Ms, 1024, 1024, moe.Forward); !near(got, want, 1e-12) {
		t.Errorf("half rate: %g, want %g", got, want)
	}
}

func TestGroupedSecondsHandWorked(t *testing.T) {
	s := testSpec
	// 8 experts × 512 rows, N = K = 1024 forward: each 4·8 = 32 tiles, 256 in
	// all → 2 waves = 264 slots of 2·128²·1024 FLOPs at 500 TFLOP/s.
	Ms := []int64{512, 512, 512, 512, 512, 512, 512, 512}
	want := 264 * 2 * 128 * 128 * 1024.0 / 500e12
	if got := s.GroupedSeconds(Ms, 1024, 1024, moe.Forward); !near(got, want, 1e-12) {
		t.Errorf("balanced: %g, want %g", got, want)
	}
	// Skewed: one expert 3584 rows, seven empty: 28·8 = 224 tiles → 2 waves → same slots.
	if got := s.GroupedSeconds([]int64{3584, 0, 0, 0, 0, 0, 0, 0}, 1024, 1024, moe.Forward); !near(got, want, 1e-12) {
		t.Errorf("skewed: %g, want %g", got, want)
	}
	// 9 rows per expert waste a whole 128-row tile each: 8 experts × 1·8 tiles = 64 tiles, one wave of 132 slots.
	wantSmall := 132 * 2 * 128 * 128 * 1024.0 / 500e12
	if got := s.GroupedSeconds([]int64{9, 9, 9, 9, 9, 9, 9, 9}, 1024, 1024, moe.Forward); !near(got, wantSmall, 1e-12) {
		t.Errorf("tiny groups: %g, want %g", got, wantSmall)
	}
}

func TestOpSecondsClasses(t *testing.T) {
	cfg := &moe.Config{Hidden: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, Experts: 8, TopK: 2, ExpertFFN: 1024, Vocab: 1000}
	s := testSpec
	// q_proj forward over 4096 tokens: M = 4096, N = 1024, K = 1024: 32·8 = 256 tiles → 2 waves.
	rec := moe.OpRecord{Op: moe.OpQProj, Pass: moe.Forward, Count: 4096 * 1024 * 1024}
	if got, want := opSeconds(t, s, cfg, rec, 1), s.GEMMSeconds(4096, 1024, 1024); got != want {
		t.Errorf("q_proj: %g, want %g", got, want)
	}
	// backward_weight of k_proj (out 256, in 1024) over 4096 tokens: M = 256, N = 1024, K = 4096.
	rec = moe.OpRecord{Op: moe.OpKProj, Pass: moe.BackwardWeight, Count: 4096 * 256 * 1024}
	if got, want := opSeconds(t, s, cfg, rec, 1), s.GEMMSeconds(256, 1024, 4096); got != want {
		t.Errorf("k_proj dW: %g, want %g", got, want)
	}
	// Attention: 1e12 multiply-adds = 2e12 FLOPs at 500 (forward) or 250 (backward) TFLOP/s.
	rec = moe.OpRecord{Op: moe.OpAttn, Pass: moe.Forward, Count: 1e12}
	if got := opSeconds(t, s, cfg, rec, 1); !near(got, 2e12/500e12, 1e-12) {
		t.Errorf("attention fwd: %g", got)
	}
	rec.Pass = moe.BackwardData
	if got := opSeconds(t, s, cfg, rec, 1); !near(got, 2e12/250e12, 1e-12) {
		t.Errorf("attention bwd: %g", got)
	}
	// AdamW on 1e9 parameters: 28e9 bytes at 2 TB/s.
	rec = moe.OpRecord{Op: moe.OpOptimizer, Pass: moe.Forward, Count: 1e9}
	if got := opSeconds(t, s, cfg, rec, 1); !near(got, 28e9/2e12, 1e-12) {
		t.Errorf("optimizer: %g", got)
	}
	// Grouped expert_up forward with 4096·2 rows over 8 local experts = 1024 rows each.
	rec = moe.OpRecord{Op: moe.OpExpertUp, Pass: moe.Forward, Count: 8192 * 1024 * 1024}
	want := s.GroupedSeconds([]int64{1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 1024, 1024, moe.Forward)
	if got := opSeconds(t, s, cfg, rec, 8); got != want {
		t.Errorf("expert_up: %g, want %g", got, want)
	}
}

func TestSplitRows(t *testing.T) {
	got := splitRows(10, 3, nil)
	if got[0]+got[1]+got[2] != 10 || got[0] != 4 || got[2] != 3 {
		t.Errorf("even split: %v", got)
	}
	got = splitRows(100, 2, []float64{3, 1})
	if got[0] != 75 || got[1] != 25 {
		t.Errorf("weighted split: %v", got)
	}
	// All-zero weights (an EP rank that received nothing) split evenly.
	got = splitRows(10, 2, []float64{0, 0})
	if got[0] != 5 || got[1] != 5 {
		t.Errorf("zero weights: %v", got)
	}
}

func TestComputeSpecCalibrated(t *testing.T) {
	c := testSpec.Calibrated(&Calibration{GEMMScale: 1.1, MemoryBoundScale: 3})
	if !near(c.GEMMEff, 0.88, 1e-12) || c.MemEff != 1 || c.GroupedEff != 0.5 {
		t.Errorf("calibrated: %+v", c)
	}
}

func opSeconds(t *testing.T, s ComputeSpec, cfg *moe.Config, rec moe.OpRecord, local int) float64 {
	t.Helper()
	v, err := s.OpSeconds(cfg, rec, local, nil)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestOpClassOf: every kind of the op vocabulary has its class (moe/ops.go:
// projections are GEMMs, expert projections grouped GEMMs, score and value
// products attention, everything else memory-bound), named as the JSON keys
// of compute_by_class_s are.
func TestOpClassOf(t *testing.T) {
	for op, want := range map[moe.Op]OpClass{
		moe.OpQProj: ClassGEMM, moe.OpLMHead: ClassGEMM, moe.OpExpertUp: ClassGrouped,
		moe.OpAttn: ClassAttention, moe.OpLoss: ClassMemoryBound, moe.OpOptimizer: ClassMemoryBound,
	} {
		if got, err := OpClassOf(op); err != nil || got != want {
			t.Errorf("OpClassOf(%s) = %v, %v; want %v", op, got, err, want)
		}
	}
	var names []string
	for _, c := range OpClasses() {
		names = append(names, c.String())
	}
	if got := strings.Join(names, " "); got != "gemm grouped_gemm attention memory_bound" {
		t.Errorf("classes %s", got)
	}
}
