package hw

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Kernels are measured kernel rates of a device: what its BF16 kernels
// reach, as fractions of the dense peak (BF16FLOPs) or of the HBM bandwidth
// (HBMBytesPerS). Each number's source is in the device's Sources under
// "kernels.<field>", and says what was measured, on which part, or from
// which nearest part it is derived when this one has no measurement.
type Kernels struct {
	// GEMMEff is the best dense BF16 matmul rate over peak, at a shape that
	// fills whole waves of tiles (the maximum achievable matmul FLOPs); the
	// compute model loses the rest of a shape's efficiency to tile and wave
	// quantization and to its operands' HBM traffic.
	GEMMEff float64 `json:"gemm_eff"`
	// GroupedEff and GroupedHalfRows give torch._grouped_mm's rate for
	// groups of m rows (tokens per expert): GroupedEff·m/(m + GroupedHalfRows)
	// of peak; the rate falls with the rows per expert, as each group's
	// tiles repeat a prologue and epilogue and load their expert's weights.
	GroupedEff      float64 `json:"grouped_eff"`
	GroupedHalfRows float64 `json:"grouped_half_rows"`
	// Attention forward and backward rates at head dim 128 and sequences of
	// 2k–16k tokens, by SDPA backend: cuDNN's fused attention (torchtitan's
	// first choice since it sets the SDPA priority) and FlashAttention-2
	// (PyTorch's default priority before that).
	CuDNNFwdEff  float64 `json:"cudnn_fwd_eff"`
	CuDNNBwdEff  float64 `json:"cudnn_bwd_eff"`
	Flash2FwdEff float64 `json:"flash2_fwd_eff"`
	Flash2BwdEff float64 `json:"flash2_bwd_eff"`
	// MemEff is the fraction of HBM bandwidth a streaming elementwise kernel
	// (copy, read-read-write) reaches.
	MemEff float64 `json:"mem_eff"`
	// NCCLCTAs is the number of SMs an NCCL collective's kernel occupies
	// while it runs (its channels, one CTA each), taken from overlapped
	// compute.
	NCCLCTAs int `json:"nccl_ctas"`
	// SustainedRatio is the matmul rate a GPU sustains once its clock has
	// settled at the power limit, as it does through a training run, over
	// the rate of a short burst at boost clock. Kernel benchmarks (the
	// GEMM, grouped-GEMM and attention rates above) time bursts, so the
	// compute model runs tensor-core kernels at these rates × this ratio.
	SustainedRatio float64 `json:"sustained_ratio"`
	// SpeedSD is the relative standard deviation of the sustained matmul
	// rate across GPUs of this part computing at once (silicon and cooling
	// differ from chip to chip). A synchronous step waits for its slowest
	// GPU, which is slower the more GPUs there are.
	SpeedSD float64 `json:"speed_sd"`
	// Low-precision kernels, as fractions of the FP8 peak (FP8FLOPs, or
	// MXFP8FLOPs for microscaled recipes): FP8GEMMEff the best dense FP8
	// GEMM; FP8GroupedEff the FP8 grouped GEMM of the forward and the
	// data gradient (2D activations by 3D expert weights) for many rows per
	// group, falling with rows per group as GroupedHalfRows says;
	// FP8GroupedWgradRatio the weight gradient's grouped GEMM (2D by 2D,
	// groups along K) over that rate. CastEff is the fraction of HBM
	// bandwidth the kernels that quantize bf16 tensors to fp8 reach.
	FP8GEMMEff           float64 `json:"fp8_gemm_eff"`
	FP8GroupedEff        float64 `json:"fp8_grouped_eff"`
	FP8GroupedWgradRatio float64 `json:"fp8_grouped_wgrad_ratio"`
	CastEff              float64 `json:"cast_eff"`
}

// Validate reports every out-of-range kernel number, named kernels.<field>.
func (k Kernels) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"gemm_eff", k.GEMMEff}, {"grouped_eff", k.GroupedEff}, {"cudnn_fwd_eff", k.CuDNNFwdEff},
		{"cudnn_bwd_eff", k.CuDNNBwdEff}, {"flash2_fwd_eff", k.Flash2FwdEff}, {"flash2_bwd_eff", k.Flash2BwdEff},
		{"mem_eff", k.MemEff}, {"sustained_ratio", k.SustainedRatio}, {"fp8_gemm_eff", k.FP8GEMMEff},
		{"fp8_grouped_eff", k.FP8GroupedEff}, {"fp8_grouped_wgrad_ratio", k.FP8GroupedWgradRatio}, {"cast_eff", k.CastEff}} {
		if !(f.v > 0 && f.v <= 1) {
			errs = append(errs, fmt.Errorf("kernels.%s = %v: must be a fraction in (0, 1]", f.name, f.v))
		}
	}
	// A group of a million rows is larger than any micro-batch's tokens.
	if !(k.GroupedHalfRows >= 0 && k.GroupedHalfRows <= 1e6) {
		errs = append(errs, fmt.Errorf("kernels.grouped_half_rows = %v: must be in [0, 1e6] rows", k.GroupedHalfRows))
	}
	// The widest spread measured is 2.4% (B200); 5% keeps the slowest of a
	// million GPUs (4.9 standard deviations below the mean) above 3/4 of it.
	if !(k.SpeedSD >= 0 && k.SpeedSD <= MaxSpeedSD) {
		errs = append(errs, fmt.Errorf("kernels.speed_sd = %v: must be in [0, %v]", k.SpeedSD, MaxSpeedSD))
	}
	if k.NCCLCTAs < 0 || k.NCCLCTAs > 1024 {
		errs = append(errs, fmt.Errorf("kernels.nccl_ctas = %d: must be in [0, 1024]", k.NCCLCTAs))
	}
	return errors.Join(errs...)
}

// KernelFields are the JSON names of Kernels' fields, each of which a
// registry device sources under "kernels.<name>".
var KernelFields = []string{"gemm_eff", "grouped_eff", "grouped_half_rows", "cudnn_fwd_eff", "cudnn_bwd_eff",
	"flash2_fwd_eff", "flash2_bwd_eff", "mem_eff", "nccl_ctas", "sustained_ratio", "speed_sd",
	"fp8_gemm_eff", "fp8_grouped_eff", "fp8_grouped_wgrad_ratio", "cast_eff"}

// MaxSpeedSD bounds Kernels.SpeedSD.
const MaxSpeedSD = 0.05

// missingKernelFields reports the fields a device document's kernels object
// leaves out (a missing rate would silently be 0).
func missingKernelFields(data []byte) error {
	var doc struct {
		Kernels json.RawMessage `json:"kernels"`
	}
	if err := json.Unmarshal(data, &doc); err != nil || len(doc.Kernels) == 0 || string(doc.Kernels) == "null" {
		return nil // decodeStrict reports malformed documents
	}
	if err := missingFields(doc.Kernels, &Kernels{}); err != nil {
		return fmt.Errorf("kernels: %w", err)
	}
	return nil
}
