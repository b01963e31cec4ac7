package layering

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/moescope/moescope"

// layers lists moescope's packages from the top down; a package may import
// only packages of a later layer. Packages that share a layer never import
// each other: the two backends of one schedule (numeric, sim), the two
// analytic accountings (flops, memory), and the leaves below moe. The
// memory verdict (memory/verdict) sits below memory, which judges with it
// as the simulator and the commands do. Package
// numeric's communicator (parallel/numeric/collective: goroutine ranks'
// collectives, knowing no model) sits below numeric and above parallel,
// whose meshes and groups it serves; the simulator's cost models
// (parallel/sim/cost) sit below it too, and what runs the simulator over
// measured runs (parallel/sim/published, then parallel/sim/calib, then
// parallel/sim/validate, which checks predictions against them) above it.
// The commands sit at the top:
// sizecheck, the CI's size check, imports only internal/sizes, which like
// every internal package sits at the bottom. Below moescope's command sits
// its own report package (the plots and the HTML page), internal to the
// command and above everything it draws.
var layers = [][]string{
	{"cmd/moescope", "internal/sizes/cmd/sizecheck"},
	{"cmd/moescope/internal/report"},
	{"parallel/crosscheck", "parallel/titanlog"},
	{"parallel/plan"},
	{"parallel/sim/validate"},
	{"parallel/sim/calib"},
	{"parallel/sim/published"},
	{"parallel/numeric", "parallel/sim"},
	{"parallel/numeric/collective", "parallel/sim/cost", "parallel/epbuffer"},
	{"parallel"},
	{"parallel/hw", "bench"},
	{"memory/host", "memory/largest"},
	{"flops", "memory"},
	{"memory/verdict"},
	{"moe/moetest"},
	{"moe/job"},
	{"moe/hf"},
	{"moe/ref"},
	{"moe/ref/rope", "moe/ref/scratch"},
	{"moe"},
	{"moe/attn"},
	{"moe/kernel", "moe/quant", "moe/safetensors"},
	{"internal/band", "internal/fileio", "internal/golden", "internal/jsonout", "internal/layering", "internal/sizes", "internal/stats"},
}

// testSupport are imported by tests only, from any layer: the shared random
// config generator and recorders, and the golden-file helper. A test of moe
// may use moetest, which builds on moe, because an external test package
// (moe_test) is a package of its own above both.
var testSupport = map[string]bool{"moe/moetest": true, "internal/golden": true}

type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// violation is one import the layering forbids, with the rule it breaks.
type violation struct{ from, to, rule string }

func (v violation) String() string { return fmt.Sprintf("%s imports %s: %s", v.from, v.to, v.rule) }

// check returns every import of pkgs that the layering forbids, and the
// module packages it has no layer for.
func check(pkgs []listed) (bad []violation, unplaced []string) {
	rank := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			rank[p] = i
		}
	}
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	for _, p := range pkgs {
		from, _ := rel(p.ImportPath)
		rf, ok := rank[from]
		if !ok {
			unplaced = append(unplaced, from)
			continue
		}
		kinds := []struct {
			imports []string
			test    bool
		}{{p.Imports, false}, {p.TestImports, true}, {p.XTestImports, true}}
		for _, k := range kinds {
			for _, imp := range k.imports {
				to, ours := rel(imp)
				if !ours || to == from {
					continue
				}
				rt, ok := rank[to]
				switch {
				case !ok:
					unplaced = append(unplaced, to)
				case testSupport[to] && !k.test:
					bad = append(bad, violation{from, to, "test support, for tests only"})
				case testSupport[to]:
				case rt == rf:
					bad = append(bad, violation{from, to, fmt.Sprintf("same layer (%s): never import each other", strings.Join(layers[rf], ", "))})
				case rt < rf:
					what := "imports"
					if k.test {
						what = "test imports"
					}
					bad = append(bad, violation{from, to, fmt.Sprintf("upward: %s layer %d (%s) from layer %d; %s only point down", to, rt, strings.Join(layers[rt], ", "), rf, what)})
				}
			}
		}
	}
	sort.Strings(unplaced)
	return bad, slices.Compact(unplaced)
}

func goList(t *testing.T) []listed {
	t.Helper()
	touchSources(t)
	cmd := exec.Command("go", "list", "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// touchSources stats every Go file of the module, so that go test's cache,
// which records the files a test opens but not what a child go list reads,
// reruns this test whenever an import may have changed.
func touchSources(t *testing.T) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".go") || d.Name() == "go.mod") {
			_, err = os.Stat(path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestImportDirection: every package's imports, and separately its tests'
// imports, point down the layers.
func TestImportDirection(t *testing.T) {
	pkgs := goList(t)
	found := map[string]bool{}
	for _, p := range pkgs {
		found[strings.TrimPrefix(p.ImportPath, module+"/")] = true
	}
	for _, l := range layers {
		for _, p := range l {
			if !found[p] {
				t.Errorf("layers names %s, which go list does not find", p)
			}
		}
	}
	bad, unplaced := check(pkgs)
	for _, u := range unplaced {
		t.Errorf("package %s has no layer: add it to layers", u)
	}
	for _, v := range bad {
		t.Error(v)
	}
}

// TestCheckCatchesViolations plants each kind of violation in a made-up
// listing and expects the rule that names it.
func TestCheckCatchesViolations(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	pkgs := []listed{
		{ImportPath: m("parallel/numeric"), Imports: []string{m("parallel/sim"), m("parallel"), "fmt"}},
		{ImportPath: m("moe"), Imports: []string{m("flops")}, XTestImports: []string{m("internal/golden"), m("moe")}},
		{ImportPath: m("flops"), TestImports: []string{m("memory")}},
		{ImportPath: m("memory"), Imports: []string{m("moe/moetest")}},
		{ImportPath: m("cmd/moescope"), Imports: []string{m("parallel/plan"), m("newpkg")}},
	}
	bad, unplaced := check(pkgs)
	var got []string
	for _, v := range bad {
		got = append(got, v.String())
	}
	want := []string{
		"parallel/numeric imports parallel/sim: same layer (parallel/numeric, parallel/sim): never import each other",
		fmt.Sprintf("moe imports flops: upward: flops layer %d (flops, memory) from layer %d; imports only point down", layerOf("flops"), layerOf("moe")),
		"flops imports memory: same layer (flops, memory): never import each other",
		"memory imports moe/moetest: test support, for tests only",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(unplaced) != 1 || unplaced[0] != "newpkg" {
		t.Errorf("unplaced = %v, want [newpkg]", unplaced)
	}
}

func layerOf(pkg string) int {
	for i, l := range layers {
		if slices.Contains(l, pkg) {
			return i
		}
	}
	return -1
}
