package hf

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/safetensors"
)

// torchrefDir is where testdata/torchref/torchref.py writes its references.
const torchrefDir = "../../testdata/torchref"

// torchrefConfigs lists the reference configurations the script writes.
var torchrefConfigs = []string{"dense", "moe", "shared", "sigmoid", "window", "aux", "gqa", "deepseek", "mla_v3", "mla_v2", "yarn_v3", "yarn_moe", "gpt_oss", "llama4"}

// TestTorchrefCheckpointsLoad opens every PyTorch-written checkpoint (BF16,
// F16, F32, single and sharded) with its config.json and checks that the
// tensor names and shapes the independent Python model uses are exactly
// cfg.Params(): the HF names of params.go against a second implementation.
func TestTorchrefCheckpointsLoad(t *testing.T) {
	for _, name := range torchrefConfigs {
		dir := filepath.Join(torchrefDir, name)
		cfg, err := Load(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ps, err := LoadParams[float64](dir, cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(ps) != len(cfg.Params()) {
			t.Fatalf("%s: %d tensors", name, len(ps))
		}
		g, err := OpenCheckpoint(filepath.Join(dir, "grads.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.CheckParams(cfg); err != nil {
			t.Errorf("%s: gradient file: %v", name, err)
		}
		g.Close()
	}
}

func TestCheckpointSharded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, ts ...safetensors.NamedTensor) {
		var b bytes.Buffer
		if err := safetensors.Write(&b, ts, "F32"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	index := func(s string) string {
		p := filepath.Join(dir, IndexFile)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("a.safetensors", safetensors.NamedTensor{Name: "x", Shape: []int{2}, Data: []float32{1, 2}}, safetensors.NamedTensor{Name: "y", Shape: []int{1}, Data: []float32{3}})
	write("b.safetensors", safetensors.NamedTensor{Name: "z", Shape: []int{1}, Data: []float32{4}})
	index(`{"metadata":{"total_size":16},"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}`)
	c, err := OpenCheckpoint(dir) // the directory: the index wins
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Names(), ","); got != "x,y,z" {
		t.Errorf("names %s", got)
	}
	if v, err := c.ReadFloat32("z"); err != nil || len(v) != 1 || v[0] != 4 {
		t.Errorf("z = %v, %v", v, err)
	}
	c.Close()
	for _, bad := range []struct{ index, want string }{
		{`{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"../b.safetensors"}}`, "must be a file name"},
		{`{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"/etc/passwd"}}`, "must be a file name"},
		{`{"weight_map":{"x":"a.safetensors","z":"b.safetensors"}}`, `holds "y"`},
		{`{"weight_map":{"x":"a.safetensors","y":"b.safetensors","z":"b.safetensors"}}`, "does not hold it"},
		{`{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"c.safetensors"}}`, "no such file"},
		{`{"weight_map":{}}`, "missing or empty"},
		{`{"weight_map":[1]}`, `want {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}, found a JSON array`},
		{`[]`, "found a JSON array"},
	} {
		_, err := OpenCheckpoint(index(bad.index))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("index %s: error %v, want one containing %q", bad.index, err, bad.want)
		}
	}
}

// stTinyConfig is a small valid qwen3_moe config built by hand.
func stTinyConfig() *moe.Config {
	return &moe.Config{
		ModelType: "qwen3_moe", Vocab: 8, Hidden: 4, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 2,
		DenseFFN: 6, MoELayer: []bool{false, true}, Window: []int{0, 0}, Experts: 2, TopK: 1, ExpertFFN: 3,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, QKNorm: moe.QKNormHead, RotaryFraction: 1,
		RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02,
	}
}

func TestSaveLoadParams(t *testing.T) {
	cfg := stTinyConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ps := cfg.Params()
	data := make([][]float64, len(ps))
	for i, p := range ps {
		data[i] = make([]float64, p.Elements())
		for j := range data[i] {
			data[i][j] = float64(i) + float64(j)/8 // exact in float32 and bf16
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	for _, dt := range []moe.DType{moe.F32, moe.BF16} {
		if err := SaveParams(path, cfg, data, dt, true); err != nil {
			t.Fatal(err)
		}
		got, err := LoadParams[float32](path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range data {
			for j := range data[i] {
				if float64(got[i][j]) != data[i][j] {
					t.Fatalf("%s: %s[%d] = %v, want %v", dt, ps[i].Name, j, got[i][j], data[i][j])
				}
			}
		}
	}
	if err := SaveParams(path, cfg, data, moe.F32, false); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("overwrite without force: %v", err)
	}

	// The same file read against a different model: every problem at once.
	other := stTinyConfig()
	other.ModelType = "mixtral" // expert names w1/w2/w3, router under block_sparse_moe
	other.Names = moe.TensorNames{MoE: "block_sparse_moe", ExpertGate: "w1", ExpertUp: "w3", ExpertDown: "w2"}
	other.Hidden = 6
	other.HeadDim = 3
	_, err := LoadParams[float32](path, other)
	if err == nil {
		t.Fatal("loading a qwen3_moe checkpoint as a different mixtral succeeded")
	}
	for _, want := range []string{"missing: model.layers.1.block_sparse_moe.gate.weight", "not parameters of the model (mixtral): model.layers.1.mlp.experts.0.down_proj.weight", "model.embed_tokens.weight has shape [8 4]; the model (mixtral) needs [8 6]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if err := SaveParams(path, cfg, data[:3], moe.F32, true); err == nil {
		t.Error("saving too few tensors succeeded")
	}
}

// TestSaveParamsLoadsInOrder pins the on-disk order: cfg.Params() order,
// which is what transformers' save_pretrained also iterates (module order).
func TestSaveParamsLoadsInOrder(t *testing.T) {
	cfg := stTinyConfig()
	ps := cfg.Params()
	data := make([][]float32, len(ps))
	for i, p := range ps {
		data[i] = make([]float32, p.Elements())
	}
	var b bytes.Buffer
	ts := make([]safetensors.NamedTensor, len(ps))
	for i, p := range ps {
		ts[i] = safetensors.NamedTensor{Name: p.Name, Shape: p.Shape, Data: data[i]}
	}
	if err := safetensors.Write(&b, ts, "F32"); err != nil {
		t.Fatal(err)
	}
	sf, err := safetensors.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, ti := range sf.Tensors() {
		got = append(got, ti.Name)
	}
	for _, p := range ps {
		want = append(want, p.Name)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("order %v, want %v", got, want)
	}
}

// TestCheckParamsMTPLayer: GLM-4.5 checkpoints hold a multi-token-prediction
// layer numbered num_hidden_layers, which transformers skips on load; other
// model types get no such pass.
func TestCheckParamsMTPLayer(t *testing.T) {
	glm, err := Load(filepath.Join(torchrefDir, "sigmoid", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg   *moe.Config
		extra string
		ok    bool
	}{
		{glm, "model.layers.2.eh_proj.weight", true},
		{glm, "model.layers.7.mlp.experts.0.up_proj.weight", true},
		{glm, "model.layers.02.eh_proj.weight", false},
		{glm, "model.mtp.weight", false},
		{stTinyConfig(), "model.layers.2.eh_proj.weight", false},
	} {
		ps := c.cfg.Params()
		ts := []safetensors.NamedTensor{{Name: c.extra, Shape: []int{1}, Data: []float32{1}}}
		for _, p := range ps {
			ts = append(ts, safetensors.NamedTensor{Name: p.Name, Shape: p.Shape, Data: make([]float32, p.Elements())})
		}
		path := filepath.Join(t.TempDir(), "w.safetensors")
		if err := fileio.WriteFileAtomic(path, false, func(w io.Writer) error { return safetensors.Write(w, ts, "F32") }); err != nil {
			t.Fatal(err)
		}
		_, err := LoadParams[float32](path, c.cfg)
		if (err == nil) != c.ok {
			t.Errorf("%s with %s: error %v, want ok = %v", c.cfg.ModelType, c.extra, err, c.ok)
		}
	}
}

func FuzzOpenIndex(f *testing.F) {
	dir := f.TempDir()
	for name, ts := range map[string][]safetensors.NamedTensor{
		"a.safetensors": {{Name: "x", Shape: []int{2}, Data: []float32{1, 2}}, {Name: "y", Shape: []int{1}, Data: []float32{3}}},
		"b.safetensors": {{Name: "z", Shape: []int{1}, Data: []float32{4}}},
	} {
		var b bytes.Buffer
		if err := safetensors.Write(&b, ts, "F32"); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Add([]byte(`{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}`))
	f.Add([]byte(`{"metadata":{"total_size":12},"weight_map":{"z":"b.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"x":"../a.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"x":"."}}`))
	index := filepath.Join(dir, IndexFile)
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(index, b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := OpenCheckpoint(index)
		if err != nil {
			return
		}
		defer c.Close()
		// Accepted: every shard is one of ours, and every tensor reads.
		for _, n := range c.Names() {
			if n != "x" && n != "y" && n != "z" {
				t.Fatalf("tensor %q from nowhere", n)
			}
			if _, err := c.ReadFloat32(n); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestCheckFinite: finite parameters pass; the first NaN or ±Inf is named
// by tensor and element.
func TestCheckFinite(t *testing.T) {
	cfg, err := Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ps := cfg.Params()
	data := make([][]float64, len(ps))
	for i, p := range ps {
		data[i] = make([]float64, p.Elements())
	}
	if err := CheckFinite(cfg, data); err != nil {
		t.Fatalf("zeros: %v", err)
	}
	data[1][3], data[2][0] = math.Inf(-1), math.NaN()
	want := "tensor " + ps[1].Name + " holds -Inf at element 3: weights must be finite"
	if err := CheckFinite(cfg, data); err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}
