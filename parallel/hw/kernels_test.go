package hw

import (
	"strings"
	"testing"
)

// TestDeviceKernels: every registry device gives its kernel rates, and a
// source for each (what was measured, or the part it is derived from).
func TestDeviceKernels(t *testing.T) {
	for _, d := range Devices() {
		if d.Kernels == nil {
			t.Errorf("%s: no kernels", d.Name)
			continue
		}
		for _, f := range KernelFields {
			if strings.TrimSpace(d.Sources["kernels."+f]) == "" {
				t.Errorf("%s: no source for kernels.%s", d.Name, f)
			}
		}
	}
}

// TestKernelsRefused: a kernels object missing a field or holding a rate
// outside (0, 1] is refused, naming the field.
func TestKernelsRefused(t *testing.T) {
	full := `"kernels":{"gemm_eff":0.8,"grouped_eff":0.3,"grouped_half_rows":400,"cudnn_fwd_eff":0.6,"cudnn_bwd_eff":0.5,` +
		`"flash2_fwd_eff":0.37,"flash2_bwd_eff":0.32,"mem_eff":0.84,"nccl_ctas":16,` +
		`"sustained_ratio":0.85,"speed_sd":0.01,"fp8_gemm_eff":0.78,"fp8_grouped_eff":0.49,"fp8_grouped_wgrad_ratio":0.76,"cast_eff":0.57},`
	with := func(k string) []byte {
		return []byte(strings.Replace(minimalDevice, `"sources":{}`, k+`"sources":{}`, 1))
	}
	if _, err := ParseDevice(with(full), "t"); err != nil {
		t.Fatalf("full kernels refused: %v", err)
	}
	for _, c := range []struct{ from, to, want string }{
		{`"mem_eff":0.84,`, ``, "kernels: mem_eff: required"},
		{`"gemm_eff":0.8`, `"gemm_eff":1.5`, "kernels.gemm_eff = 1.5: must be a fraction in (0, 1]"},
		{`"grouped_half_rows":400`, `"grouped_half_rows":-1`, "kernels.grouped_half_rows = -1"},
		{`"nccl_ctas":16`, `"nccl_ctas":5000`, "kernels.nccl_ctas = 5000"},
		{`"sustained_ratio":0.85`, `"sustained_ratio":0`, "kernels.sustained_ratio = 0: must be a fraction in (0, 1]"},
		{`"speed_sd":0.01`, `"speed_sd":0.2`, "kernels.speed_sd = 0.2: must be in [0, 0.05]"},
	} {
		_, err := ParseDevice(with(strings.Replace(full, c.from, c.to, 1)), "t")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s → %s: %v, want %q", c.from, c.to, err, c.want)
		}
	}
}
