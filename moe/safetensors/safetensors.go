// Package safetensors reads and writes the safetensors file format
// (Hugging Face's tensor container): header parsing and validation as the
// reference implementation does it, typed reads that widen BF16, F16 and F64
// to float, and writes of F32 or BF16. It knows no model: names, shapes and
// which tensors a model needs are package moe's.
//
// It imports only internal/fileio; moe and everything above it import it.
package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sort"
	"strconv"

	"github.com/moescope/moescope/internal/fileio"
)

// The safetensors format (github.com/huggingface/safetensors, README "Format"):
//
//	8 bytes   N, the header length, unsigned little-endian
//	N bytes   a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
//	rest      the data section; offsets are relative to its start, tensors are row-major little-endian
//
// Readers here follow the reference implementation's validation
// (safetensors/src/tensor.rs, Metadata::validate): every dtype known, the
// byte range of each tensor equal to product(shape)·size(dtype), ranges
// sorted by offset contiguous from 0 to the end of the data section (no
// overlaps, no holes), and the header at most 100,000,000 bytes
// (MAX_HEADER_SIZE there).

// maxHeaderBytes bounds the JSON header, as the reference implementation does.
const maxHeaderBytes = 100_000_000

// stDTypeSize is the element size in bytes of every dtype the format
// defines (safetensors/src/tensor.rs, enum Dtype). Only F64, F32, F16 and
// BF16 convert to floating point here; the others are recognised so that a
// well-formed file holding them parses and gets a precise error when read.
var stDTypeSize = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// TensorInfo is one header entry of a safetensors file.
type TensorInfo struct {
	Name  string
	DType string // the format's name: "F32", "BF16", "F16", ...
	Shape []int
	// Begin and End are byte offsets into the data section, End exclusive.
	Begin, End int64
}

// Elements is the product of the shape.
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, s := range t.Shape {
		n *= int64(s)
	}
	return n
}

// File is an open, validated safetensors file. Tensors are read
// on demand with ReadAt, so opening a file allocates only its header.
type File struct {
	Path     string
	Metadata map[string]string
	f        io.ReaderAt
	closer   io.Closer
	data     int64 // file offset of the data section
	tensors  []TensorInfo
	index    map[string]int
}

// Open opens and validates path. The caller closes it.
func Open(path string) (*File, error) {
	f, err := fileio.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	sf, err := newFile(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sf.Path, sf.closer = path, f
	return sf, nil
}

// Parse validates a safetensors image held in memory.
func Parse(b []byte) (*File, error) {
	return newFile(bytes.NewReader(b), int64(len(b)))
}

func newFile(r io.ReaderAt, size int64) (*File, error) {
	var lenBuf [8]byte
	if size < 8 {
		return nil, fmt.Errorf("safetensors: file of %d bytes is shorter than the 8-byte header length", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(size-8) {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the %d bytes after it", n, size-8)
	}
	if n > maxHeaderBytes {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the limit of %d bytes", n, maxHeaderBytes)
	}
	header := make([]byte, n) // n ≤ size − 8: checked against the file above
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("safetensors: reading %d-byte header: %w", n, err)
	}
	dataLen := size - 8 - int64(n)
	tensors, meta, err := parseHeader(header, dataLen)
	if err != nil {
		return nil, err
	}
	sf := &File{Metadata: meta, f: r, data: 8 + int64(n), tensors: tensors, index: make(map[string]int, len(tensors))}
	for i, t := range tensors {
		sf.index[t.Name] = i
	}
	return sf, nil
}

// Close releases the file.
func (s *File) Close() error {
	if s.closer == nil {
		return nil
	}
	return s.closer.Close()
}

// Tensors lists the header entries in data-section order.
func (s *File) Tensors() []TensorInfo { return s.tensors }

// Info returns the header entry of name.
func (s *File) Info(name string) (TensorInfo, bool) {
	i, ok := s.index[name]
	if !ok {
		return TensorInfo{}, false
	}
	return s.tensors[i], true
}

// rawEntry is a header entry as JSON spells it.
type rawEntry struct {
	DType       string            `json:"dtype"`
	Shape       []json.RawMessage `json:"shape"`
	DataOffsets []json.RawMessage `json:"data_offsets"`
}

// parseNonNeg reads a JSON integer in [0, max].
func parseNonNeg(raw json.RawMessage, max int64) (int64, error) {
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || v < 0 || v > max {
		return 0, fmt.Errorf("%s is not an integer in [0, %d]", raw, max)
	}
	return v, nil
}

// parseHeader validates a JSON header against a data section of
// dataLen bytes and returns the tensors sorted by offset.
func parseHeader(header []byte, dataLen int64) ([]TensorInfo, map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(header))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("safetensors: header is not a JSON object")
	}
	var (
		tensors []TensorInfo
		meta    map[string]string
		seen    = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: header JSON: %w", err)
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, nil, fmt.Errorf("safetensors: header names %q twice", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("safetensors: header JSON at %q: %w", name, err)
		}
		if name == "__metadata__" {
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors: __metadata__ must map strings to strings, found %s", raw)
			}
			continue
		}
		if name == "" {
			return nil, nil, errors.New("safetensors: header has a tensor with an empty name")
		}
		t, err := parseEntry(name, raw, dataLen)
		if err != nil {
			return nil, nil, err
		}
		tensors = append(tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("safetensors: header JSON: %w", err)
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, nil, errors.New("safetensors: bytes after the header's JSON object (only space padding is allowed)")
	}
	// Sorted by offset, the ranges must tile [0, dataLen) exactly.
	sort.SliceStable(tensors, func(i, j int) bool {
		if tensors[i].Begin != tensors[j].Begin {
			return tensors[i].Begin < tensors[j].Begin
		}
		return tensors[i].End < tensors[j].End
	})
	var at int64
	for _, t := range tensors {
		if t.Begin != at {
			if t.Begin < at {
				return nil, nil, fmt.Errorf("safetensors: tensor %q at bytes [%d, %d) overlaps the one before it (ends at %d)", t.Name, t.Begin, t.End, at)
			}
			return nil, nil, fmt.Errorf("safetensors: bytes [%d, %d) of the data section belong to no tensor (next: %q)", at, t.Begin, t.Name)
		}
		at = t.End
	}
	if at != dataLen {
		return nil, nil, fmt.Errorf("safetensors: tensors cover %d bytes of a %d-byte data section", at, dataLen)
	}
	return tensors, meta, nil
}

func parseEntry(name string, raw json.RawMessage, dataLen int64) (TensorInfo, error) {
	var e rawEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return TensorInfo{}, fmt.Errorf(`safetensors: tensor %q: entry must be {"dtype": string, "shape": [integers], "data_offsets": [begin, end]}, found %.80s`, name, raw)
	}
	size, ok := stDTypeSize[e.DType]
	if !ok {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, e.DType)
	}
	if e.Shape == nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: no shape", name)
	}
	t := TensorInfo{Name: name, DType: e.DType, Shape: make([]int, len(e.Shape))}
	elems := uint64(1) // checked product: a hostile shape cannot wrap it
	for i, r := range e.Shape {
		d, err := parseNonNeg(r, math.MaxInt32)
		if err != nil {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: shape[%d] = %v", name, i, err)
		}
		t.Shape[i] = int(d)
		hi, lo := bits.Mul64(elems, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: shape %v has more than 2⁶³ elements", name, rawShape(e.Shape))
		}
		elems = lo
	}
	if len(e.DataOffsets) != 2 {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets must be [begin, end], got %d numbers", name, len(e.DataOffsets))
	}
	var err error
	if t.Begin, err = parseNonNeg(e.DataOffsets[0], dataLen); err != nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets begin %v (data section is %d bytes)", name, err, dataLen)
	}
	if t.End, err = parseNonNeg(e.DataOffsets[1], dataLen); err != nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets end %v (data section is %d bytes)", name, err, dataLen)
	}
	if t.End < t.Begin {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] end before they begin", name, t.Begin, t.End)
	}
	if elems > uint64(dataLen) || int64(elems)*size != t.End-t.Begin {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: shape %v of %s needs %d elements × %d bytes, but data_offsets span %d bytes",
			name, t.Shape, e.DType, elems, size, t.End-t.Begin)
	}
	return t, nil
}

func rawShape(s []json.RawMessage) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// ReadFloat32 reads a floating-point tensor (F32, BF16, F16 or F64) as float32.
func (s *File) ReadFloat32(name string) ([]float32, error) {
	return readAs[float32](s, name)
}

// ReadFloat64 reads a floating-point tensor (F32, BF16, F16 or F64) as float64.
func (s *File) ReadFloat64(name string) ([]float64, error) {
	return readAs[float64](s, name)
}

// ReadBytes reads a U8 tensor's raw bytes (packed formats such as MXFP4's
// blocks and scales, which the caller decodes).
func (s *File) ReadBytes(name string) ([]byte, error) {
	t, ok := s.Info(name)
	if !ok {
		return nil, fmt.Errorf("safetensors %s: no tensor %q", s.Path, name)
	}
	if t.DType != "U8" {
		return nil, fmt.Errorf("safetensors %s: tensor %q has dtype %s; ReadBytes reads U8 only", s.Path, name, t.DType)
	}
	out := make([]byte, t.End-t.Begin) // validated: inside the file
	if _, err := s.f.ReadAt(out, s.data+t.Begin); err != nil {
		return nil, fmt.Errorf("safetensors %s: reading %q: %w", s.Path, name, err)
	}
	return out, nil
}

// readChunk is how many bytes are converted at a time.
const readChunk = 1 << 20

func readAs[T float32 | float64](s *File, name string) ([]T, error) {
	t, ok := s.Info(name)
	if !ok {
		return nil, fmt.Errorf("safetensors %s: no tensor %q", s.Path, name)
	}
	var conv func([]byte) float64
	switch t.DType {
	case "F32":
		conv = func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) }
	case "F64":
		conv = func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }
	case "BF16":
		conv = func(b []byte) float64 { return float64(BF16ToFloat32(binary.LittleEndian.Uint16(b))) }
	case "F16":
		conv = func(b []byte) float64 { return float64(F16ToFloat32(binary.LittleEndian.Uint16(b))) }
	default:
		return nil, fmt.Errorf("safetensors %s: tensor %q has dtype %s; only F32, BF16, F16 and F64 convert to floating point", s.Path, name, t.DType)
	}
	size := stDTypeSize[t.DType]
	out := make([]T, t.Elements()) // validated: Elements·size fits inside the file
	buf := make([]byte, min(readChunk, t.End-t.Begin))
	for done := int64(0); done < t.End-t.Begin; {
		n := min(int64(len(buf)), t.End-t.Begin-done)
		if _, err := s.f.ReadAt(buf[:n], s.data+t.Begin+done); err != nil {
			return nil, fmt.Errorf("safetensors %s: reading %q: %w", s.Path, name, err)
		}
		first := done / size
		for i := int64(0); i < n/size; i++ {
			out[first+i] = T(conv(buf[i*size:]))
		}
		done += n
	}
	return out, nil
}

// BF16ToFloat32 widens a bfloat16 bit pattern (the top 16 bits of a float32).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds to the nearest bfloat16, ties to even, as PyTorch's
// c10::BFloat16 round_to_nearest_even does; NaN stays NaN.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40 // keep sign, force a quiet NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToFloat32 widens an IEEE 754 binary16 bit pattern, subnormals,
// infinities and NaN included.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: man·2⁻²⁴
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13) // rebias 15 → 127
}

// NamedTensor is a float32 tensor to write.
type NamedTensor struct {
	Name  string
	Shape []int
	Data  []float32 // row-major, len = product(Shape)
}

// Write writes tensors in the given order as dtype "F32" or
// "BF16", the format's names (BF16 rounds to nearest even). The header is padded with spaces to a
// multiple of 8 bytes and carries {"format": "pt"} metadata, which
// transformers requires to load a file.
func Write(w io.Writer, tensors []NamedTensor, dtype string) error {
	var size int64
	switch dtype {
	case "F32":
		size = 4
	case "BF16":
		size = 2
	default:
		return fmt.Errorf("safetensors: cannot write dtype %q (F32 or BF16)", dtype)
	}
	var hdr bytes.Buffer
	hdr.WriteString(`{"__metadata__":{"format":"pt"}`)
	var at int64
	seen := map[string]bool{}
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" || seen[t.Name] {
			return fmt.Errorf("safetensors: tensor name %q is empty, reserved or repeated", t.Name)
		}
		seen[t.Name] = true
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		if n != int64(len(t.Data)) {
			return fmt.Errorf("safetensors: tensor %q: shape %v holds %d elements, data has %d", t.Name, t.Shape, n, len(t.Data))
		}
		name, _ := json.Marshal(t.Name)
		shape, _ := json.Marshal(append([]int{}, t.Shape...))
		fmt.Fprintf(&hdr, `,%s:{"dtype":%q,"shape":%s,"data_offsets":[%d,%d]}`, name, dtype, shape, at, at+n*size)
		at += n * size
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(hdr.Len()))
	bw.Write(lenBuf[:])
	bw.Write(hdr.Bytes())
	var el [4]byte
	for _, t := range tensors {
		for _, v := range t.Data {
			if dtype == "F32" {
				binary.LittleEndian.PutUint32(el[:], math.Float32bits(v))
			} else {
				binary.LittleEndian.PutUint16(el[:], Float32ToBF16(v))
			}
			bw.Write(el[:size])
		}
	}
	return bw.Flush()
}
