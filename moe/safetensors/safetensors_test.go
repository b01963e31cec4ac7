package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"
)

// stImage assembles a safetensors file by hand: length prefix, header, data.
func stImage(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func TestSafetensorsReadHandBuilt(t *testing.T) {
	// F16 bit patterns and their values from IEEE 754 binary16:
	// 0x3c00 = 1, 0xc000 = −2, 0x0001 = 2⁻²⁴ (smallest subnormal),
	// 0x7bff = 65504 (largest finite), 0x7c00 = +Inf, 0x3555 = 1365/4096 = 0.333251953125.
	f16 := []uint16{0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0x3555}
	f16Want := []float64{1, -2, math.Ldexp(1, -24), 65504, math.Inf(1), 0.333251953125}
	// BF16 is the top half of a float32: 0x3f80 = 1, 0xbfc0 = −1.5, 0x4049 = 3.140625.
	bf16 := []uint16{0x3f80, 0xbfc0, 0x4049}
	bf16Want := []float64{1, -1.5, 3.140625}
	var data bytes.Buffer
	binary.Write(&data, binary.LittleEndian, []float32{0.5, -0.25})
	binary.Write(&data, binary.LittleEndian, f16)
	binary.Write(&data, binary.LittleEndian, bf16)
	hdr := `{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],"data_offsets":[8,20]},` +
		`"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"c":{"dtype":"BF16","shape":[3],"data_offsets":[20,26]}}  `
	sf, err := Parse(stImage(hdr, data.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if sf.Metadata["format"] != "pt" {
		t.Errorf("metadata = %v", sf.Metadata)
	}
	if got := sf.Tensors(); len(got) != 3 || got[0].Name != "a" || got[1].Name != "b" || got[2].Name != "c" {
		t.Errorf("tensors not in offset order: %+v", got)
	}
	for _, c := range []struct {
		name string
		want []float64
	}{{"a", []float64{0.5, -0.25}}, {"b", f16Want}, {"c", bf16Want}} {
		got, err := sf.ReadFloat64(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("%s: %d values, want %d", c.name, len(got), len(c.want))
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s[%d] = %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
	if _, err := sf.ReadFloat32("zz"); err == nil {
		t.Error("reading an absent tensor succeeded")
	}
}

func TestFloat32ToBF16(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		// 1 + 2⁻⁸ lies halfway between bf16 1 (0x3f80) and 1 + 2⁻⁷ (0x3f81): ties to even → 0x3f80.
		{1 + 1.0/256, 0x3f80},
		// 1 + 3·2⁻⁸ lies halfway between 0x3f81 and 0x3f82: ties to even → 0x3f82.
		{1 + 3.0/256, 0x3f82},
		// 1 + 2⁻⁸ + 2⁻²⁰ is just above the halfway point → rounds up to 0x3f81.
		{1 + 1.0/256 + 1.0/(1<<20), 0x3f81},
		{float32(math.Inf(-1)), 0xff80},
	} {
		if got := Float32ToBF16(c.in); got != c.want {
			t.Errorf("Float32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if v := BF16ToFloat32(Float32ToBF16(float32(math.NaN()))); v == v {
		t.Error("NaN did not stay NaN")
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	ts := []NamedTensor{
		{Name: "w", Shape: []int{2, 3}, Data: []float32{1, -2, 3.5, 1e-30, -0, 7}},
		{Name: "empty", Shape: []int{0, 4}, Data: nil},
		{Name: "s", Shape: []int{}, Data: []float32{3.25}},
	}
	for _, dt := range []string{"F32", "BF16"} {
		var b bytes.Buffer
		if err := Write(&b, ts, dt); err != nil {
			t.Fatal(err)
		}
		if hl := binary.LittleEndian.Uint64(b.Bytes()); hl%8 != 0 {
			t.Errorf("%s: header length %d not a multiple of 8", dt, hl)
		}
		sf, err := Parse(b.Bytes())
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		for _, want := range ts {
			info, ok := sf.Info(want.Name)
			if !ok || !slices.Equal(info.Shape, want.Shape) || info.DType != dt {
				t.Errorf("%s: %q header %+v", dt, want.Name, info)
			}
			got, err := sf.ReadFloat32(want.Name)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want.Data {
				w := want.Data[i]
				if dt == "BF16" {
					w = BF16ToFloat32(Float32ToBF16(w))
				}
				if got[i] != w {
					t.Errorf("%s: %s[%d] = %v, want %v", dt, want.Name, i, got[i], w)
				}
			}
		}
	}
	var b bytes.Buffer
	for _, bad := range [][]NamedTensor{
		{{Name: "x", Shape: []int{3}, Data: []float32{1}}},
		{{Name: "x", Shape: []int{1}, Data: []float32{1}}, {Name: "x", Shape: []int{1}, Data: []float32{1}}},
		{{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}},
	} {
		if err := Write(&b, bad, "F32"); err == nil {
			t.Errorf("Write(%v) succeeded", bad)
		}
	}
	if err := Write(&b, ts, "F16"); err == nil {
		t.Error("writing F16 succeeded")
	}
}

func TestSafetensorsRejects(t *testing.T) {
	f32x2 := make([]byte, 8)
	big := make([]byte, 8)
	binary.LittleEndian.PutUint64(big, 1<<40)
	for _, c := range []struct {
		name string
		file []byte
		want string // substring of the error
	}{
		{"short", []byte{1, 2, 3}, "shorter than"},
		{"header longer than file", append(big, []byte("{}")...), "exceeds the"},
		{"not JSON", stImage("[1,2]   ", nil), "not a JSON object"},
		{"truncated JSON", stImage(`{"a":{"dtype":"F32"`, nil), "header JSON"},
		{"unknown dtype", stImage(`{"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}`, f32x2), `unknown dtype "F31"`},
		{"end past data", stImage(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, f32x2), "data_offsets end"},
		{"negative offset", stImage(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, f32x2), "data_offsets begin"},
		{"end before begin", stImage(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, f32x2), "end before"},
		{"shape mismatch", stImage(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, f32x2), "needs 3 elements × 4 bytes"},
		{"dtype mismatch", stImage(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}}`, f32x2), "needs 2 elements × 2 bytes"},
		{"negative dim", stImage(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, f32x2), "shape[0]"},
		{"fractional dim", stImage(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, f32x2), "shape[0]"},
		{"overflowing shape", stImage(`{"a":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,8]}}`, f32x2), "more than 2⁶³"},
		{"no shape", stImage(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, f32x2), "no shape"},
		{"three offsets", stImage(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}`, f32x2), "[begin, end]"},
		{"overlap", stImage(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32x2), "overlaps"},
		{"hole", stImage(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32x2), "belong to no tensor"},
		{"uncovered tail", stImage(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32x2), "cover 4 bytes of a 8-byte"},
		{"duplicate name", stImage(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32x2), "twice"},
		{"empty name", stImage(`{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32x2), "empty name"},
		{"bad metadata", stImage(`{"__metadata__":{"x":1}}`, nil), `__metadata__ must map strings to strings, found {"x":1}`},
		{"entry not an object", stImage(`{"a":5}`, nil), `tensor "a": entry must be {"dtype": string`},
		{"dtype not a string", stImage(`{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}`, f32x2), `entry must be`},
		{"trailing bytes", stImage(`{} {}`, nil), "after the header"},
	} {
		_, err := Parse(c.file)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// A well-formed file with a non-float dtype parses, but does not read as floats.
	sf, err := Parse(stImage(`{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, f32x2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sf.ReadFloat32("i"); err == nil || !strings.Contains(err.Error(), "I64") {
		t.Errorf("reading I64 as float: %v", err)
	}
}

func FuzzParseSafetensors(f *testing.F) {
	var good bytes.Buffer
	Write(&good, []NamedTensor{{Name: "a", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}, {Name: "b", Shape: []int{1}, Data: []float32{5}}}, "BF16")
	f.Add(good.Bytes())
	f.Add(stImage(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, []byte{0, 0x3c, 0, 0x7c}))
	f.Add(stImage(`{"a":{"dtype":"F32","shape":[2147483647,2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, '{'})
	f.Fuzz(func(t *testing.T, b []byte) {
		sf, err := Parse(b)
		if err != nil {
			return
		}
		var total int64
		for _, ti := range sf.Tensors() {
			total += ti.End - ti.Begin
			if ti.End-ti.Begin != ti.Elements()*stDTypeSize[ti.DType] {
				t.Fatalf("%q: accepted a byte range that does not match its shape", ti.Name)
			}
			v, err := sf.ReadFloat32(ti.Name)
			switch ti.DType {
			case "F32", "F16", "BF16", "F64":
				if err != nil || int64(len(v)) != ti.Elements() {
					t.Fatalf("%q: %d values, err %v", ti.Name, len(v), err)
				}
			default:
				if err == nil {
					t.Fatalf("%q: %s read as floats", ti.Name, ti.DType)
				}
			}
		}
		if hl := binary.LittleEndian.Uint64(b); total != int64(len(b))-8-int64(hl) {
			t.Fatalf("tensors cover %d bytes of a %d-byte data section", total, int64(len(b))-8-int64(hl))
		}
	})
}

// TestWriteSafetensorsBytes pins the exact bytes written, derived by hand
// from the format: header length 88 (the 85-byte JSON below padded with 3
// spaces to a multiple of 8), the header, then 1.0 and −2.0 as
// little-endian float32 (0x3f800000, 0xc0000000).
func TestWriteSafetensorsBytes(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, []NamedTensor{{Name: "a", Shape: []int{2}, Data: []float32{1, -2}}}, "F32"); err != nil {
		t.Fatal(err)
	}
	hdr := `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	if len(hdr) != 85 {
		t.Fatalf("hand count wrong: %d", len(hdr))
	}
	want := append([]byte{88, 0, 0, 0, 0, 0, 0, 0}, hdr+"   "...)
	want = append(want, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0)
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("wrote\n%q\nwant\n%q", b.Bytes(), want)
	}
}
