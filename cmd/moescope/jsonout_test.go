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
// writeJSON finds it before printing (jsonout.Marshal, whose test has the
// field paths) and names the command and the field.
func TestJSONOutputNonFiniteRefused(t *testing.T) {
	type report struct {
		AC        moe.AC             `json:"ac"`
		Breakdown map[string]float64 `json:"exposed_comm_s"`
	}
	var out bytes.Buffer
	if err := writeJSON(&out, "simulate", report{Breakdown: map[string]float64{"all_gather": 1}}); err != nil || !strings.HasSuffix(out.String(), "}\n") {
		t.Fatalf("finite report: %v\n%s", err, out.String())
	}
	out.Reset()
	bad := report{Breakdown: map[string]float64{"all_gather": 1, "reduce_scatter": math.Inf(1)}}
	want := "simulate: JSON output: exposed_comm_s.reduce_scatter = +Inf is not a finite number (an input outside what the model can represent); nothing printed"
	if err := writeJSON(&out, "simulate", bad); err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q before the error", out.String())
	}
	if err := writeJSONLine(&out, "grad", bad); err == nil || !strings.HasPrefix(err.Error(), "grad: JSON output: exposed_comm_s.reduce_scatter = +Inf") || out.Len() != 0 {
		t.Errorf("one-line: %v, printed %q", err, out.String())
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
