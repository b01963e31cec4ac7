package jsonout

import (
	"errors"
	"math"
	"strings"
	"testing"
)

type inner struct {
	Seconds map[string]float64 `json:"exposed_comm_s"`
}

type Embedded struct {
	MFU float64 `json:"mfu"`
}

type report struct {
	AC        textValue `json:"ac"` // marshals itself: never searched
	Name      string    `json:"name"`
	Skip      float64   `json:"-"`
	Breakdown inner     `json:"breakdown"`
	Layers    []*inner  `json:"layers"`
	Plain     float32   // no tag: Go's name
	Interval  []float64 `json:"tps_interval,omitempty"`
	Embedded
}

// textValue is a value that marshals itself as text.
type textValue float64

func (textValue) MarshalText() ([]byte, error) { return []byte("t"), nil }

// TestMarshalNonFinite (issue 17, defect 13): a finite value marshals as
// encoding/json writes it, with a final newline, on one line or indented;
// a NaN or ±Inf is a *NonFiniteError naming the first such field by its
// JSON path (map keys in sorted order, slice indexes, embedded fields as
// the outer object's, Go's name without a tag), never encoding/json's
// "unsupported value".
func TestMarshalNonFinite(t *testing.T) {
	ok := report{Name: "x", Skip: math.Inf(1), Breakdown: inner{map[string]float64{"all_gather": 1}}}
	for indent, want := range map[string]string{"": `{"ac":"t","name":"x","breakdown":{"exposed_comm_s":{"all_gather":1}},"layers":null,"Plain":0,"mfu":0}` + "\n",
		"  ": "{\n  \"ac\": \"t\",\n  \"name\": \"x\",\n"} {
		b, err := Marshal(ok, indent)
		if err != nil || !strings.HasPrefix(string(b), want) || !strings.HasSuffix(string(b), "}\n") {
			t.Errorf("indent %q: %v\n%s", indent, err, b)
		}
	}
	for _, c := range []struct {
		r    report
		path string
	}{
		{report{Breakdown: inner{map[string]float64{"all_gather": 1, "reduce_scatter": math.Inf(1), "z": math.NaN()}}}, "breakdown.exposed_comm_s.reduce_scatter"},
		{report{Layers: []*inner{nil, {map[string]float64{"a2a": math.NaN()}}}}, "layers[1].exposed_comm_s.a2a"},
		{report{Plain: float32(math.Inf(-1))}, "Plain"},
		{report{Interval: []float64{1, math.Inf(1)}}, "tps_interval[1]"},
		{report{Embedded: Embedded{MFU: math.Inf(1)}}, "mfu"},
	} {
		b, err := Marshal(c.r, "  ")
		var nf *NonFiniteError
		if !errors.As(err, &nf) || nf.Path != c.path || !(math.IsNaN(nf.Value) || math.IsInf(nf.Value, 0)) || b != nil {
			t.Errorf("%s: %v (%q), want a NonFiniteError at it", c.path, err, b)
		}
		if err != nil && strings.Contains(err.Error(), "unsupported value") {
			t.Errorf("%s: %v", c.path, err)
		}
	}
	if _, err := Marshal(report{Plain: float32(math.Inf(-1))}, ""); err == nil || err.Error() != "Plain = -Inf is not a finite number" {
		t.Errorf("one line: %v", err)
	}
}
