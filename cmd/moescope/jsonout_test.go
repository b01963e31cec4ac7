package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestJSONOutputNonFiniteRefused (issue 17, defect 13): a value JSON cannot
// hold was printed as half a document and "json: unsupported value: +Inf";
// writeJSON finds it before printing and names the command and the field.
func TestJSONOutputNonFiniteRefused(t *testing.T) {
	type inner struct {
		Seconds map[string]float64 `json:"exposed_comm_s"`
	}
	type Embedded struct {
		MFU float64 `json:"mfu"`
	}
	type report struct {
		AC        moe.AC    `json:"ac"`
		Name      string    `json:"name"`
		Skip      float64   `json:"-"`
		Breakdown inner     `json:"breakdown"`
		Layers    []*inner  `json:"layers"`
		Plain     float32   // no tag: Go's name
		Interval  []float64 `json:"tps_interval,omitempty"`
		Embedded
	}
	ok := report{Name: "x", Skip: math.Inf(1), Breakdown: inner{map[string]float64{"all_gather": 1}}}
	var out bytes.Buffer
	if err := writeJSON(&out, "simulate", ok); err != nil || !strings.HasSuffix(out.String(), "}\n") {
		t.Fatalf("finite report: %v\n%s", err, out.String())
	}
	for _, c := range []struct {
		r    report
		want string
	}{
		{report{Breakdown: inner{map[string]float64{"all_gather": 1, "reduce_scatter": math.Inf(1)}}}, "breakdown.exposed_comm_s.reduce_scatter = +Inf"},
		{report{Layers: []*inner{nil, {map[string]float64{"a2a": math.NaN()}}}}, "layers[1].exposed_comm_s.a2a = NaN"},
		{report{Plain: float32(math.Inf(-1))}, "Plain = -Inf"},
		{report{Interval: []float64{1, math.Inf(1)}}, "tps_interval[1] = +Inf"},
		{report{Embedded: Embedded{MFU: math.Inf(1)}}, "simulate: JSON output: mfu = +Inf is not a finite number"},
	} {
		out.Reset()
		err := writeJSON(&out, "simulate", c.r)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "unsupported value") {
			t.Errorf("error %v, want %q", err, c.want)
		}
		if out.Len() != 0 {
			t.Errorf("%q: printed %q before the error", c.want, out.String())
		}
		if err := writeJSONLine(&out, "grad", c.r); err == nil || !strings.Contains(err.Error(), "grad: JSON output") {
			t.Errorf("one-line: %v", err)
		}
	}
}

// TestEveryJSONOutputUsesWriteJSON: no command of this package encodes JSON
// output other than through writeJSON, writeJSONLine or marshalJSON (a
// json.Encoder or json.Marshal call elsewhere could print +Inf's error).
func TestEveryJSONOutputUsesWriteJSON(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "jsonout.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "json" {
				switch sel.Sel.Name {
				case "NewEncoder", "Marshal", "MarshalIndent":
					t.Errorf("%s: json.%s: use writeJSON (jsonout.go)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
