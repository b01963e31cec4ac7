package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/safetensors"
)

// IndexFile is the name transformers gives the index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// maxIndexBytes bounds the index JSON we are willing to read (a
// 1,000-layer, 256-expert model's index is about 100 MB).
const maxIndexBytes = 256 << 20

// Checkpoint is a set of tensors spread over one or more safetensors files:
// a single file, or the shards a model.safetensors.index.json names.
type Checkpoint struct {
	Path   string                       // what was opened
	files  []*safetensors.File          // open shards
	byName map[string]*safetensors.File // tensor name → its shard
}

// OpenCheckpoint opens path: a .safetensors file, a
// model.safetensors.index.json (its weight_map names shards beside it), or a
// directory holding either (the index first, then model.safetensors).
// Every shard is validated; a tensor the index maps to one shard but
// another shard also holds, a shard holding tensors the index does not map
// to it, or a mapped tensor missing from its shard is an error.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		idx := filepath.Join(path, IndexFile)
		if _, err := os.Stat(idx); err == nil {
			return openIndex(idx)
		}
		single := filepath.Join(path, "model.safetensors")
		if _, err := os.Stat(single); err == nil {
			return openSingle(single)
		}
		return nil, fmt.Errorf("%s: directory holds neither %s nor model.safetensors", path, IndexFile)
	}
	if strings.HasSuffix(path, ".json") {
		return openIndex(path)
	}
	return openSingle(path)
}

func openSingle(path string) (*Checkpoint, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Path: path, files: []*safetensors.File{f}, byName: map[string]*safetensors.File{}}
	for _, t := range f.Tensors() {
		c.byName[t.Name] = f
	}
	return c, nil
}

// checkpointIndex is model.safetensors.index.json.
type checkpointIndex struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

func openIndex(path string) (*Checkpoint, error) {
	b, err := fileio.ReadBounded(path, maxIndexBytes)
	var big *fileio.TooLargeError
	if errors.As(err, &big) {
		return nil, fmt.Errorf("%s: index larger than %d bytes", path, maxIndexBytes)
	}
	if err != nil {
		return nil, err
	}
	var idx checkpointIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			err = fmt.Errorf(`want {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}, found a JSON %s at byte %d`, typ.Value, typ.Offset)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is missing or empty", path)
	}
	dir := filepath.Dir(path)
	c := &Checkpoint{Path: path, byName: map[string]*safetensors.File{}}
	shards := map[string]*safetensors.File{}
	names := make([]string, 0, len(idx.WeightMap))
	for n := range idx.WeightMap {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		shard := idx.WeightMap[n]
		if shard == "" || shard != filepath.Base(shard) || shard == "." || shard == ".." || strings.ContainsAny(shard, `/\`) {
			c.Close()
			return nil, fmt.Errorf("%s: weight_map[%q] = %q: must be a file name in the index's directory", path, n, shard)
		}
		sf, ok := shards[shard]
		if !ok {
			if sf, err = safetensors.Open(filepath.Join(dir, shard)); err != nil {
				c.Close()
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			shards[shard] = sf
			c.files = append(c.files, sf)
		}
		if _, ok := sf.Info(n); !ok {
			c.Close()
			return nil, fmt.Errorf("%s: weight_map puts %q in %s, which does not hold it", path, n, shard)
		}
		c.byName[n] = sf
	}
	for name, sf := range shards {
		for _, t := range sf.Tensors() {
			if want, ok := idx.WeightMap[t.Name]; !ok || want != name {
				c.Close()
				return nil, fmt.Errorf("%s: shard %s holds %q, which weight_map does not put there", path, name, t.Name)
			}
		}
	}
	return c, nil
}

// Close closes every shard.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// Names lists every tensor, sorted.
func (c *Checkpoint) Names() []string {
	out := make([]string, 0, len(c.byName))
	for n := range c.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Info returns the header entry of a tensor.
func (c *Checkpoint) Info(name string) (safetensors.TensorInfo, bool) {
	f, ok := c.byName[name]
	if !ok {
		return safetensors.TensorInfo{}, false
	}
	return f.Info(name)
}

// ReadFloat32 reads a tensor from whichever shard holds it.
func (c *Checkpoint) ReadFloat32(name string) ([]float32, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", c.Path, name)
	}
	return f.ReadFloat32(name)
}

// ReadFloat64 reads a tensor from whichever shard holds it.
func (c *Checkpoint) ReadFloat64(name string) ([]float64, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", c.Path, name)
	}
	return f.ReadFloat64(name)
}

// ReadBytes reads a U8 tensor from whichever shard holds it.
func (c *Checkpoint) ReadBytes(name string) ([]byte, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", c.Path, name)
	}
	return f.ReadBytes(name)
}

// maxListed bounds how many names an error message lists.
const maxListed = 8

func listNames(names []string) string {
	if len(names) > maxListed {
		return fmt.Sprintf("%s, … (%d in all)", strings.Join(names[:maxListed], ", "), len(names))
	}
	return strings.Join(names, ", ")
}

// CheckParams verifies that the checkpoint holds exactly cfg.Params(): no
// tensor missing, none extra (except those transformers itself skips, see
// skippedByHF), every shape equal, every dtype floating point. All problems
// are reported at once.
func (c *Checkpoint) CheckParams(cfg *moe.Config) error {
	fs := fileTensors(cfg.Params())
	want := make(map[string]bool, len(fs))
	var missing, extra []string
	var errs []error
	for _, p := range fs {
		want[p.name] = true
		t, ok := c.Info(p.name)
		if !ok && p.stacked {
			shape, packed, err := c.mxfp4Shape(p.name)
			switch {
			case err != nil:
				errs = append(errs, err)
				continue
			case packed:
				want[p.name+mxfp4Blocks], want[p.name+mxfp4Scales] = true, true
				if !equalShape(shape, p.shape) {
					errs = append(errs, fmt.Errorf("MXFP4 tensor %s unpacks to shape %v; the model (%s) needs %v", p.name, shape, cfg.ModelType, p.shape))
				}
				continue
			}
		}
		if !ok {
			missing = append(missing, p.name)
			continue
		}
		if !equalShape(t.Shape, p.shape) {
			errs = append(errs, fmt.Errorf("tensor %s has shape %v; the model (%s) needs %v", p.name, t.Shape, cfg.ModelType, p.shape))
		}
		switch t.DType {
		case "F32", "BF16", "F16", "F64":
		default:
			errs = append(errs, fmt.Errorf("tensor %s has dtype %s; weights must be F32, BF16, F16 or F64", p.name, t.DType))
		}
	}
	for n := range c.byName {
		if !want[n] && !skippedByHF(cfg, n) {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%d tensors the model (%s) needs are missing: %s", len(missing), cfg.ModelType, listNames(missing)))
	}
	if len(extra) > 0 {
		errs = append(errs, fmt.Errorf("%d tensors are not parameters of the model (%s): %s", len(extra), cfg.ModelType, listNames(extra)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	return nil
}

// skippedByHF reports whether a checkpoint tensor outside cfg.Params() is
// one transformers deliberately drops when loading the model type, so that
// such checkpoints load as they do there: GLM-4.5 checkpoints carry their
// multi-token-prediction block (num_nextn_predict_layers) as layer
// num_hidden_layers, which Glm4MoeModel._keys_to_ignore_on_load_unexpected
// skips (r"model\.layers\.92.*" and r"model\.layers\.46.*", the
// 92-layer GLM-4.5 and the 46-layer Air; modeling_glm4_moe.py, transformers
// commit 000c33fd). Here any layer index ≥ num_hidden_layers is skipped
// when cfg.IgnoreExtraLayers (set for glm4_moe). Every other tensor outside
// the model is an error.
func skippedByHF(cfg *moe.Config, name string) bool {
	if !cfg.IgnoreExtraLayers {
		return false
	}
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return false
	}
	num, _, ok := strings.Cut(rest, ".")
	n, err := strconv.Atoi(num)
	return ok && err == nil && n >= cfg.Layers && strconv.Itoa(n) == num
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// LoadParams reads the model's parameters from path (see OpenCheckpoint),
// converted to T, in cfg.Params() order: out[i] is the row-major data of
// cfg.Params()[i]. The checkpoint must hold exactly those tensors
// (CheckParams).
func LoadParams[T float32 | float64](path string, cfg *moe.Config) ([][]T, error) {
	c, err := OpenCheckpoint(path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.CheckParams(cfg); err != nil {
		return nil, err
	}
	ps := cfg.Params()
	out := make([][]T, len(ps))
	for _, f := range fileTensors(ps) {
		v, err := readTensor[T](c, f)
		if err != nil {
			return nil, err
		}
		for _, i := range f.params { // a stack's slices, in order
			n := int(ps[i].Elements())
			out[i], v = v[:n:n], v[n:]
		}
	}
	return out, nil
}

// readTensor reads one file tensor as T: a floating-point tensor, or a
// stack held as MXFP4 blocks and scales (CheckParams has checked them).
func readTensor[T float32 | float64](c *Checkpoint, f fileTensor) ([]T, error) {
	if _, plain := c.Info(f.name); !plain && f.stacked {
		return readMXFP4[T](c, f.name, f.shape)
	}
	var zero T
	if _, ok := any(zero).(float32); ok {
		w, err := c.ReadFloat32(f.name)
		return any(w).([]T), err
	}
	w, err := c.ReadFloat64(f.name)
	return any(w).([]T), err
}

// CheckFinite refuses parameters holding NaN or ±Inf, naming the first
// such tensor and element: a loss and every gradient computed from them
// would be NaN. ps is in cfg.Params() order (LoadParams).
func CheckFinite[T float32 | float64](cfg *moe.Config, ps [][]T) error {
	for i, p := range cfg.Params() {
		for j, v := range ps[i] {
			if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("tensor %s holds %v at element %d: weights must be finite", p.Name, f, j)
			}
		}
	}
	return nil
}

// SaveParams writes tensors in cfg.Params() order (data[i] belongs to
// cfg.Params()[i]) to a single safetensors file at path, as F32 or BF16,
// atomically; an existing file is replaced only when force is set.
func SaveParams[T float32 | float64](path string, cfg *moe.Config, data [][]T, dtype moe.DType, force bool) error {
	ps := cfg.Params()
	if len(data) != len(ps) {
		return fmt.Errorf("save %s: %d tensors given, the model (%s) has %d", path, len(data), cfg.ModelType, len(ps))
	}
	for i, p := range ps {
		if int64(len(data[i])) != p.Elements() {
			return fmt.Errorf("save %s: tensor %s has %d elements, shape %v needs %d", path, p.Name, len(data[i]), p.Shape, p.Elements())
		}
	}
	fs := fileTensors(ps)
	ts := make([]safetensors.NamedTensor, len(fs))
	for k, f := range fs {
		var v []float32
		for _, i := range f.params { // a stack's slices, concatenated
			switch d := any(data[i]).(type) {
			case []float32:
				v = append(v, d...)
			case []float64:
				for _, x := range d {
					v = append(v, float32(x))
				}
			}
		}
		ts[k] = safetensors.NamedTensor{Name: f.name, Shape: f.shape, Data: v}
	}
	var name string
	switch dtype {
	case moe.F32:
		name = "F32"
	case moe.BF16:
		name = "BF16"
	default:
		return fmt.Errorf("save %s: cannot write dtype %q (f32 or bf16)", path, dtype)
	}
	return fileio.WriteFileAtomic(path, force, func(w io.Writer) error { return safetensors.Write(w, ts, name) })
}
