package hf

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mxfp4Dir holds the MXFP4 checkpoint testdata/mxfp4/mxfp4.py writes.
var mxfp4Dir = filepath.Join("..", "..", "testdata", "mxfp4")

// TestMXFP4Dequantize loads the MXFP4 checkpoint and checks elements worked
// by hand from the OCP MX v1.0 specification (e2m1: sign, 2 exponent bits
// of bias 1, 1 mantissa bit; e8m0 scale 2^(s − 127)) and the script's byte
// formulas: block byte (e, r, g, j) = (97e + 7r + 13j + 5) mod 256, element
// 2j in its low nibble and 2j+1 in its high one, scale 125 + (e + r) mod 5;
// logical element [e][c][r] of gate_up_proj [E, D, 2F] is Params' slice
// gate_up_proj[e] [D, 2F] at c·2F + r, of down_proj [E, F, D] down_proj[e]
// at c·D + r.
func TestMXFP4Dequantize(t *testing.T) {
	cfg, err := Load(filepath.Join(mxfp4Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := LoadParams[float64](mxfp4Dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string][]float64{}
	for i, p := range cfg.Params() {
		byName[p.Name] = ps[i]
	}
	const x = "model.layers.0.mlp.experts."
	const twoF, D = 64, 32
	for _, tc := range []struct {
		what       string
		tensor     string
		col, row   int
		want       float64
		derivation string
	}{
		{"gate_up [0][0][0]", x + "gate_up_proj[0]", 0, 0, 0.75,
			"byte 5 = 0x05, low nibble 0101: +, exponent 2, mantissa 1 → 2^1·1.5 = 3; scale 125 → ×2^-2"},
		{"gate_up [0][1][0]", x + "gate_up_proj[0]", 1, 0, 0, "high nibble of 0x05 is 0 → +0"},
		{"gate_up [1][2][2]", x + "gate_up_proj[1]", 2, 2, 1,
			"byte 97+14+13+5 = 129 = 0x81, low nibble 0001: subnormal 0.5; scale 125+3 = 128 → ×2"},
		{"gate_up [1][4][3]", x + "gate_up_proj[1]", 4, 3, 12,
			"byte 97+21+26+5 = 149 = 0x95, low nibble 0101 → 3; scale 125+4 = 129 → ×4"},
		{"gate_up [1][5][3]", x + "gate_up_proj[1]", 5, 3, -2,
			"high nibble of 0x95 is 1001: −, subnormal 0.5 → −0.5; ×4"},
		{"down [0][31][7]", x + "down_proj[0]", 31, 7, -6,
			"byte 49+195+5 = 249 = 0xF9, high nibble 1111: −, exponent 3, mantissa 1 → −2^2·1.5; scale 125+2 = 127 → ×1"},
		{"down [0][30][7]", x + "down_proj[0]", 30, 7, -0.5, "low nibble of 0xF9 is 1001 → −0.5; ×1"},
	} {
		width := twoF
		if strings.Contains(tc.tensor, "down_proj") {
			width = D
		}
		if got := byName[tc.tensor][tc.col*width+tc.row]; got != tc.want {
			t.Errorf("%s = %v, want %v (%s)", tc.what, got, tc.want, tc.derivation)
		}
	}
	// gate_up_proj_bias [2, 64] is F32: element [1][3] is the stack's 67th,
	// (67 mod 7 − 3)/8 = 1/8.
	if got := byName["model.layers.0.mlp.experts.gate_up_proj_bias[1]"][3]; got != 0.125 {
		t.Errorf("gate_up_proj_bias[1][3] = %v, want 0.125: the F32 stacks beside the MXFP4 ones", got)
	}
}

// TestMXFP4Refusals: a NaN scale (e8m0 0xFF), blocks without scales and
// scales whose shape does not match the blocks are refused by name.
func TestMXFP4Refusals(t *testing.T) {
	cfg, err := Load(filepath.Join(mxfp4Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(mxfp4Dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(mxfp4Dir)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := ck.Info("model.layers.0.mlp.experts.down_proj_scales")
	ck.Close()
	nan := append([]byte(nil), raw...)
	nan[8+int64(binary.LittleEndian.Uint64(raw))+info.Begin+5] = 0xFF
	renamed := strings.Replace(string(raw), "down_proj_scales", "down_proj_scaleX", 1)
	reshaped := strings.Replace(string(raw), `down_proj_scales":{"dtype":"U8","shape":[2,32,1]`, `down_proj_scales":{"dtype":"U8","shape":[2,1,32]`, 1)
	for _, tc := range []struct {
		name, data, want string
	}{
		{"NaN scale", string(nan), "0xFF"},
		{"no scales", renamed, "down_proj_blocks has no model.layers.0.mlp.experts.down_proj_scales"},
		{"scales shape", reshaped, "need blocks [E, R, C/32, 16] and scales [E, R, C/32]"},
	} {
		if tc.data == string(raw) {
			t.Fatalf("%s: the edit did not apply", tc.name)
		}
		p := filepath.Join(t.TempDir(), "model.safetensors")
		if err := os.WriteFile(p, []byte(tc.data), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadParams[float32](p, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// FuzzMXFP4Checkpoint: any bytes in place of the MXFP4 checkpoint load or
// fail with an error, never a panic (the packed shapes index the data).
func FuzzMXFP4Checkpoint(f *testing.F) {
	raw, err := os.ReadFile(filepath.Join(mxfp4Dir, "model.safetensors"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add([]byte(strings.Replace(string(raw), `"shape":[2,32,1]`, `"shape":[2,16,2]`, 1)))
	cfg, err := Load(filepath.Join(mxfp4Dir, "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "model.safetensors")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _ = LoadParams[float32](p, cfg)
	})
}
