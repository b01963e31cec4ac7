package hw

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestDeviceRegistry(t *testing.T) {
	want := []string{"b200", "b300", "gb200", "gb300", "h100", "h100-96gb", "h200", "mi300x", "mi355x"}
	if got := DeviceNames(); !reflect.DeepEqual(got, want) {
		t.Fatalf("DeviceNames() = %v, want %v", got, want)
	}
	for i, d := range Devices() {
		// A file's name is the device's name (LookupDevice finds it by file).
		if d.Name != want[i] {
			t.Errorf("devices/%s.json names itself %q", want[i], d.Name)
		}
		// Every number has a source.
		for _, f := range []string{"bf16_flops", "fp8_flops", "memory_bytes", "hbm_bytes_per_s", "sms"} {
			if strings.TrimSpace(d.Sources[f]) == "" {
				t.Errorf("%s: no source for %s", d.Name, f)
			}
		}
		if d.FP8FLOPs < d.BF16FLOPs {
			t.Errorf("%s: fp8 peak %g below bf16 %g", d.Name, d.FP8FLOPs, d.BF16FLOPs)
		}
	}
}

func TestDeviceFacts(t *testing.T) {
	// shared/REFERENCES.md: B200 total_memory as PyTorch reports it is 178.35 GiB;
	// torchtitan's B200 peak is 2.25e15 and H100 SXM's 989e12.
	b, err := LookupDevice("")
	if err != nil || b.Name != "b200" {
		t.Fatalf("default device: %v %v", b.Name, err)
	}
	if g := b.MemoryGiB(); math.Abs(g-178.35) > 0.005 {
		t.Errorf("b200 memory %.4f GiB, want 178.35", g)
	}
	if b.BF16FLOPs != 2.25e15 || b.SMs != 148 {
		t.Errorf("b200 bf16 %g sms %d", b.BF16FLOPs, b.SMs)
	}
	h, err := LookupDevice("H100")
	if err != nil || h.BF16FLOPs != 989e12 || h.SMs != 132 {
		t.Errorf("h100: %+v %v", h, err)
	}
	// torchtitan's 96 GB H100: its logged "memory: X GiB(Y%)" (Y = 100 ×
	// max reserved / total_memory) of pytorch/torchtitan PR #1690 must round
	// to the logged percentages with this capacity.
	g, err := LookupDevice("h100-96gb")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ gib, pct float64 }{{81.85, 86.17}, {81.47, 85.76}, {89.33, 94.04}, {63.27, 66.60}} {
		if got := 100 * l.gib / g.MemoryGiB(); math.Abs(got-l.pct) > 0.005+0.005*100/g.MemoryGiB() {
			t.Errorf("h100-96gb: %.2f GiB is %.3f%% of %.3f GiB; torchtitan logged %.2f%%", l.gib, got, g.MemoryGiB(), l.pct)
		}
	}
	if g.HBMBytesPerS != 2.4e12 || g.BF16FLOPs != h.BF16FLOPs {
		t.Errorf("h100-96gb: hbm %g bf16 %g", g.HBMBytesPerS, g.BF16FLOPs)
	}
}

func TestLookupDeviceUnknown(t *testing.T) {
	_, err := LookupDevice("a100")
	if err == nil || !strings.Contains(err.Error(), "b200") || !strings.Contains(err.Error(), "mi355x") {
		t.Errorf("unknown device error should list known names: %v", err)
	}
	if _, err := LookupDevice("../clusters/hgx"); err == nil {
		t.Error("path-like name accepted")
	}
}

func TestParseDeviceErrors(t *testing.T) {
	_, err := ParseDevice([]byte(`{"name":"x","bf16_flops":-1,"fp8_flops":0,"memory_bytes":0,"hbm_bytes_per_s":1,"sms":-2}`), "t")
	for _, w := range []string{"bf16_flops = -1", "fp8_flops = 0", "memory_bytes = 0", "sms = -2"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	if _, err := ParseDevice([]byte(minimalDevice), "t"); err != nil {
		t.Errorf("minimal device rejected: %v", err)
	}
	if _, err := ParseDevice([]byte(minimalDevice+` {"name":"y"}`), "t"); err == nil || !strings.Contains(err.Error(), "data after") {
		t.Errorf("trailing document accepted: %v", err)
	}
	if _, err := ParseDevice([]byte(`{"name":"x","bf16_flop":1}`), "t"); err == nil || !strings.Contains(err.Error(), "bf16_flop") {
		t.Errorf("unknown field not rejected: %v", err)
	}
}

// minimalDevice gives every required field of a device, each in range.
const minimalDevice = `{"name":"x","bf16_flops":1e15,"fp8_flops":2e15,"mxfp8_flops":0,"fp4_flops":0,"cuda_compute_capability":9.0,"memory_bytes":85899345920,"hbm_bytes_per_s":3e12,
	"sms":0,"outside_bytes":0,"outside_ep_bytes":0,"sources":{}}`

// TestDeviceAbsurdValuesRefused (issue 17, defect 8): finite but absurd
// numbers are refused, each naming its field, value and physical range; the
// bounds themselves are accepted.
func TestDeviceAbsurdValuesRefused(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{`"bf16_flops":1e15`, `"bf16_flops":1e-300`, "bf16_flops = 1e-300: must be in [1e+12, 1e+17] FLOP/s"},
		{`"bf16_flops":1e15`, `"bf16_flops":1e300`, "bf16_flops = 1e+300: must be in [1e+12, 1e+17]"},
		{`"fp8_flops":2e15`, `"fp8_flops":1e18`, "fp8_flops = 1e+18: must be in [1e+12, 1e+17]"},
		{`"hbm_bytes_per_s":3e12`, `"hbm_bytes_per_s":1e-300`, "hbm_bytes_per_s = 1e-300: must be in [1e+11, 1e+14] bytes/s"},
		{`"hbm_bytes_per_s":3e12`, `"hbm_bytes_per_s":1e15`, "hbm_bytes_per_s = 1e+15"},
		{`"memory_bytes":85899345920`, `"memory_bytes":9223372036854775807`, "memory_bytes = 9223372036854775807: must be in [1073741824, 35184372088832] bytes"},
		{`"memory_bytes":85899345920`, `"memory_bytes":1000`, "memory_bytes = 1000"},
		{`"sms":0`, `"sms":0,"launch_overhead_s":1e300`, "launch_overhead_s = 1e+300: must be in [0, 0.001] seconds"},
		{`"sms":0`, `"sms":100000`, "sms = 100000: must be in [0, 65536]"},
	} {
		doc := strings.Replace(minimalDevice, c.from, c.to, 1)
		if _, err := ParseDevice([]byte(doc), "t"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.to, err, c.want)
		}
	}
	for _, c := range []struct{ from, to string }{
		{`"bf16_flops":1e15`, `"bf16_flops":1e12`}, {`"fp8_flops":2e15`, `"fp8_flops":1e17`},
		{`"hbm_bytes_per_s":3e12`, `"hbm_bytes_per_s":1e14`}, {`"memory_bytes":85899345920`, `"memory_bytes":35184372088832`},
		{`"sms":0`, `"sms":0,"launch_overhead_s":1e-3`},
	} {
		if _, err := ParseDevice([]byte(strings.Replace(minimalDevice, c.from, c.to, 1)), "t"); err != nil {
			t.Errorf("%s (a bound) refused: %v", c.to, err)
		}
	}
}

// TestDeviceMissingFieldRefused (issue 17, defect 8): a required number
// left out, or null, is an error naming it, not a silent 0; description and
// launch_overhead_s may be left out.
func TestDeviceMissingFieldRefused(t *testing.T) {
	for _, f := range []string{"bf16_flops", "fp8_flops", "memory_bytes", "hbm_bytes_per_s", "sms", "outside_bytes", "outside_ep_bytes"} {
		var m map[string]any
		if err := json.Unmarshal([]byte(minimalDevice), &m); err != nil {
			t.Fatal(err)
		}
		for _, v := range []any{"delete", nil} {
			if v == "delete" {
				delete(m, f)
			} else {
				m[f] = nil
			}
			doc, _ := json.Marshal(m)
			if _, err := ParseDevice(doc, "t"); err == nil || !strings.Contains(err.Error(), f+": required") {
				t.Errorf("%s %v: error %v", f, v, err)
			}
		}
	}
}

// FuzzParseDevice: no input panics; an accepted device validates.
func FuzzParseDevice(f *testing.F) {
	for _, n := range DeviceNames() {
		data, _ := registryEntry("devices", n)
		f.Add(data)
	}
	f.Add([]byte(`{"name":"x","bf16_flops":1e400}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseDevice(data, "fuzz")
		if err == nil && d.Validate() != nil {
			t.Fatal("accepted device does not validate")
		}
	})
}
