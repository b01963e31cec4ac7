package hw

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe/job"
)

// Device is one accelerator model of the registry. Peaks are dense (no 2:4
// sparsity) tensor-core rates; MFU divides by BF16FLOPs.
//
// Units: FLOP/s, bytes (MemoryBytes is the capacity PyTorch reports as
// torch.cuda.get_device_properties().total_memory, the denominator of
// torchtitan's memory %), bytes per second.
//
// The registry is data (devices/*.json, one file per device, a source per
// number in Sources keyed by JSON field). New fields are added to the struct
// and to every file together; unknown fields in a file are errors, and so
// is a missing field whose tag lacks omitempty (a missing number would
// silently be 0). Validate gives every number a physical range.
type Device struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// BF16FLOPs and FP8FLOPs are the dense peak tensor-core rates, FLOP/s.
	BF16FLOPs float64 `json:"bf16_flops"`
	FP8FLOPs  float64 `json:"fp8_flops"`
	// MXFP8FLOPs is the dense peak of microscaled FP8 (OCP MX: e4m3 with
	// an e8m0 scale per 32 elements), FLOP/s; 0 for a part whose tensor
	// cores have no MX formats (Hopper, CDNA 3), which cannot run mxfp8.
	MXFP8FLOPs float64 `json:"mxfp8_flops"`
	// FP4FLOPs is the dense peak of NVFP4 (e2m1 with an e4m3 scale per 16
	// elements), FLOP/s; 0 for a part without FP4 tensor cores (everything
	// before Blackwell), which cannot run nvfp4.
	FP4FLOPs float64 `json:"fp4_flops"`
	// CUDACompute is the part's CUDA compute capability (9.0 Hopper, 10.0
	// and 10.3 Blackwell); 0 for a part that is not NVIDIA's.
	CUDACompute float64 `json:"cuda_compute_capability"`
	// MemoryBytes is the device capacity as PyTorch reports it (total_memory).
	MemoryBytes int64 `json:"memory_bytes"`
	// HBMBytesPerS is the peak HBM bandwidth, bytes/s.
	HBMBytesPerS float64 `json:"hbm_bytes_per_s"`
	// SMs is the number of streaming multiprocessors (compute units on AMD)
	// a kernel can occupy; 0 when no published figure was found.
	SMs int `json:"sms"`
	// OutsideBytes is the device memory an FSDP training process uses
	// outside PyTorch's caching allocator (CUDA context and loaded kernels,
	// the NCCL communicators of the world and the FSDP groups), which
	// torch.cuda.max_memory_reserved does not count but an out-of-memory
	// error does; OutsideEPBytes is what the expert-parallel all-to-all
	// communicator adds. Estimates, each stated in Sources.
	OutsideBytes   int64 `json:"outside_bytes"`
	OutsideEPBytes int64 `json:"outside_ep_bytes"`
	// LaunchOverheadS is the time one kernel launch adds to a kernel on
	// the critical path, seconds; 0 = the compute model's default.
	LaunchOverheadS float64 `json:"launch_overhead_s,omitempty"`
	// Kernels are the device's measured kernel rates; nil for a device
	// file that gives none (the compute model then uses its fallbacks).
	Kernels *Kernels `json:"kernels,omitempty"`
	// Sources gives the origin of each number, keyed by its JSON field.
	Sources map[string]string `json:"sources"`
}

// DefaultDeviceName is the device used when none is given (DESIGN: b200).
const DefaultDeviceName = "b200"

// GiB is 2^30 bytes.
const GiB = 1 << 30

// Outside is the memory outside PyTorch's allocator of a rank whose layout
// has expert-parallel degree ep.
func (d Device) Outside(ep int) int64 {
	if ep > 1 {
		return d.OutsideBytes + d.OutsideEPBytes
	}
	return d.OutsideBytes
}

// Runs refuses, naming device and recipe, a training recipe whose number
// format the device's tensor cores lack: microscaled (MX) recipes need a
// part with an MX peak (MXFP8FLOPs), nvfp4 one with an FP4 peak
// (FP4FLOPs), fp8-blockwise TransformerEngine's FP8 block-scaled GEMMs,
// which it enables at compute capability 9.0 and above (Hopper and
// Blackwell; TransformerEngine d0067d0d transformer_engine/pytorch/quantization.py
// _compute_fp8_block_scaling_support, with CUDA 12.9 or later).
func (d Device) Runs(p job.Precision) error {
	if p.Blockwise() && d.CUDACompute < minBlockScaledCC {
		return fmt.Errorf("precision = %s: device %s has no FP8 block-scaled GEMMs (TransformerEngine's Float8BlockScaling needs CUDA compute capability %.1f or above; the registry gives %s compute capability %v, 0 for a part not NVIDIA's); blockwise needs %s",
			p, d.Name, minBlockScaledCC, d.Name, d.CUDACompute, strings.Join(devicesWith(func(d Device) float64 { return max(d.CUDACompute-minBlockScaledCC+1, 0) }), ", "))
	}
	if p.Microscaled() && !(d.MXFP8FLOPs > 0) {
		return fmt.Errorf("precision = %s: device %s has no MX tensor-core formats (its registry entry gives no mxfp8_flops); MX needs %s", p, d.Name, strings.Join(devicesWith(func(d Device) float64 { return d.MXFP8FLOPs }), ", "))
	}
	if p.FP4() && !(d.FP4FLOPs > 0) {
		return fmt.Errorf("precision = %s: device %s has no NVFP4 tensor cores (its registry entry gives no fp4_flops); NVFP4 needs %s", p, d.Name, strings.Join(devicesWith(func(d Device) float64 { return d.FP4FLOPs }), ", "))
	}
	return nil
}

// minBlockScaledCC is the compute capability from which TransformerEngine
// runs FP8 block-scaled GEMMs (Runs).
const minBlockScaledCC = 9.0

// devicesWith lists the registry's devices with a positive peak(d).
func devicesWith(peak func(Device) float64) []string {
	var out []string
	for _, d := range Devices() {
		if peak(d) > 0 {
			out = append(out, d.Name)
		}
	}
	return out
}

// MemoryGiB is MemoryBytes in GiB (2^30 bytes).
func (d Device) MemoryGiB() float64 { return float64(d.MemoryBytes) / GiB }

// DeviceNames lists the registry's device names, sorted.
func DeviceNames() []string { return registryNames("devices") }

// Devices returns every device of the registry, sorted by name.
func Devices() []Device {
	var ds []Device
	for _, n := range DeviceNames() {
		d, err := LookupDevice(n)
		if err != nil {
			panic("hw: embedded device " + n + ": " + err.Error())
		}
		ds = append(ds, d)
	}
	return ds
}

// LookupDevice returns a device by name (case-insensitive; "" means
// DefaultDeviceName). An unknown name is an error listing the known ones.
func LookupDevice(name string) (Device, error) {
	if name == "" {
		name = DefaultDeviceName
	}
	data, ok := registryEntry("devices", name)
	if !ok {
		return Device{}, unknownDevice(name)
	}
	return ParseDevice(data, strings.ToLower(name))
}

func unknownDevice(name string) error {
	return fmt.Errorf("gpu %q: unknown (known: %s)", name, strings.Join(DeviceNames(), ", "))
}

// ParseDevice decodes and validates one device JSON document; unknown
// fields are errors, and so are missing ones other than description,
// launch_overhead_s and kernels (missingFields); a kernels object must give
// every one of its fields.
func ParseDevice(data []byte, where string) (Device, error) {
	var d Device
	if err := decodeStrict(data, &d); err != nil {
		return Device{}, fmt.Errorf("device %s: %w", where, err)
	}
	if err := errors.Join(missingFields(data, &d), missingKernelFields(data), d.Validate()); err != nil {
		return Device{}, fmt.Errorf("device %s: %w", where, err)
	}
	return d, nil
}

// Validate reports every out-of-range field at once. Each range is physical,
// with a margin over every part announced (bound).
func (d Device) Validate() error {
	var errs []error
	bad := func(field string, v any, allowed string) {
		errs = append(errs, fmt.Errorf("%s = %v: %s", field, v, allowed))
	}
	if d.Name == "" {
		bad("name", `""`, "must be non-empty")
	}
	errs = append(errs, checkBounds([]bound{
		// The fastest dense rate in the registry is 5e15 FP8 (GB200,
		// MI355X); 1e17 is 20 times that. A V100 (2017) gives 1.25e14 on
		// its tensor cores: a part under 1e12 trains nothing.
		{"bf16_flops", d.BF16FLOPs, 1e12, 1e17, "FLOP/s"},
		{"fp8_flops", d.FP8FLOPs, 1e12, 1e17, "FLOP/s"},
		{"mxfp8_flops", d.MXFP8FLOPs, 0, 1e17, "FLOP/s (0 = no MX formats)"},
		{"fp4_flops", d.FP4FLOPs, 0, 1e17, "FLOP/s (0 = no NVFP4)"},
		// Volta is 7.0; 20 leaves room for parts not yet announced.
		{"cuda_compute_capability", d.CUDACompute, 0, 20, "(0 = not an NVIDIA part)"},
		// HBM3e gives 8e12 (B200, MI355X), HBM4 parts announce about
		// 2e13; 1e14 has five times that as margin. GDDR parts (T4: 3.2e11)
		// stay above 1e11.
		{"hbm_bytes_per_s", d.HBMBytesPerS, 1e11, 1e14, "bytes/s"},
		// A launch costs 2–10 µs (NVIDIA's CUDA Graphs blog, see the
		// registry's sources); 1 ms is 100 times the most.
		{"launch_overhead_s", d.LaunchOverheadS, 0, 1e-3, "seconds (0 = the compute model's default)"},
	})...)
	// The largest part holds 288 GB (MI355X, about 2^38 bytes); 2^45 (32
	// TiB) is a hundred times that; no training part has under 1 GiB.
	if d.MemoryBytes < GiB || d.MemoryBytes > 1<<45 {
		bad("memory_bytes", d.MemoryBytes, fmt.Sprintf("must be in [%d, %d] bytes (1 GiB to 32 TiB)", GiB, int64(1)<<45))
	}
	if d.OutsideBytes < 0 || (d.MemoryBytes > 0 && d.OutsideBytes >= d.MemoryBytes) {
		bad("outside_bytes", d.OutsideBytes, "must be in [0, memory_bytes)")
	}
	if d.OutsideEPBytes < 0 || (d.MemoryBytes > 0 && d.OutsideEPBytes >= d.MemoryBytes-d.OutsideBytes) {
		bad("outside_ep_bytes", d.OutsideEPBytes, "must be in [0, memory_bytes − outside_bytes)")
	}
	// H100 has 132 SMs, MI300X 304 compute units; 65536 is 200 times that.
	if d.SMs < 0 || d.SMs > 1<<16 {
		bad("sms", d.SMs, "must be in [0, 65536] (0 = unknown)")
	}
	if d.Kernels != nil {
		errs = append(errs, d.Kernels.Validate())
	}
	return errors.Join(errs...)
}
