package plan

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// quantRecipe is torchtitan's default recipe with precision p converting
// sets (nil: the recipe's default) and the fp8 all-gather ag, validated.
func quantRecipe(t *testing.T, p job.Precision, sets job.Quantize, ag bool) job.Recipe {
	t.Helper()
	r := job.DefaultRecipe()
	r.Precision, r.Quantize, r.FP8AllGather = p, sets, ag
	if err := r.Resolve(); err != nil {
		t.Fatalf("%s %v: %v", p, sets, err)
	}
	return r
}

// quantExport is recipe r's export of an 8-GPU FSDP + EP 8 plan of
// qwen3-30b-a3b.
func quantExport(r job.Recipe) TorchtitanExport {
	e := RecipeExport(r)
	e.Model, e.Seq, e.Point = "qwen3-30b-a3b", 4096, torchtitanPoint(1, 8, 8, moe.AC{Mode: moe.ACSelective}, 2, 1, true)
	return e
}

// tomlTables flattens a decoded TOML document into its tables by dotted
// name ([quantize.linear.float8] is "quantize.linear.float8").
func tomlTables(doc map[string]any, prefix string, out map[string]map[string]any) {
	keys := map[string]any{}
	for k, v := range doc {
		if sub, ok := v.(map[string]any); ok {
			tomlTables(sub, prefix+k+".", out)
			continue
		}
		keys[k] = v
	}
	if len(keys) > 0 {
		out[strings.TrimSuffix(prefix, ".")] = keys
	}
}

// TestTorchtitanQuantTOML: each low-precision recipe writes, for v0.2.2,
// the literals read by hand from job_config.py and the quantization
// converters at 73a0e69: [model] converters of registered names, a
// [quantize.linear.float8] without recipe_name (the tensorwise branch,
// the only one that takes the FSDP float8 all-gather), MX linears with
// recipe "mxfp8_cublas", MX grouped GEMMs on "experts"; filter_fqns leave
// the router's gate and, unless converted, the head out ("layers" when
// only the head is converted). Every table and key is in the schema
// excerpt; every FQN fragment is one it lists.
func TestTorchtitanQuantTOML(t *testing.T) {
	var schema struct {
		torchtitanTOMLSchema
		ModuleFQNs map[string]string `json:"module_fqns"`
	}
	torchtitanLoad(t, "v0.2.2-job_config.json", &schema)
	const mxGrouped = "[quantize.grouped_mm.mx]\nrecipe_name = \"mxfp8\"\nfqns = [\"experts\"]\n"
	for _, c := range []struct {
		p     job.Precision
		sets  job.Quantize
		ag    bool
		want  []string // literal lines, by hand
		never []string
	}{
		{job.BF16, nil, false, nil, []string{"converters", "quantize"}},
		{job.FP8Tensorwise, nil, false, []string{"converters = [\"quantize.linear.float8\"]\n",
			"[quantize.linear.float8]\nenable_fsdp_float8_all_gather = false\nprecompute_float8_dynamic_scale_for_fsdp = false\nfilter_fqns = [\"output\", \"router.gate\"]\n"},
			[]string{"recipe_name =", ".mx"}},
		{job.FP8Tensorwise, job.Quantize{job.QuantLinear, job.QuantOutput}, true, []string{
			"[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\nfilter_fqns = [\"router.gate\"]\n"},
			[]string{"recipe_name ="}},
		{job.FP8Tensorwise, job.Quantize{job.QuantOutput}, false, []string{"filter_fqns = [\"layers\"]\n"}, nil},
		{job.MXFP8, nil, false, []string{"converters = [\"quantize.linear.mx\", \"quantize.grouped_mm.mx\"]\n",
			"[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\nfilter_fqns = [\"output\", \"router.gate\"]\n", mxGrouped},
			[]string{"float8"}},
		{job.MXFP8, job.Quantize{job.QuantExperts}, false, []string{"converters = [\"quantize.grouped_mm.mx\"]\n", mxGrouped},
			[]string{"quantize.linear", "filter_fqns"}},
		{job.MXFP8, job.Quantize{job.QuantLinear}, false, []string{"converters = [\"quantize.linear.mx\"]\n",
			"filter_fqns = [\"output\", \"router.gate\"]\n"}, []string{"grouped_mm"}},
		{job.MXFP8, job.Quantize{job.QuantOutput, job.QuantExperts}, false, []string{"converters = [\"quantize.linear.mx\", \"quantize.grouped_mm.mx\"]\n",
			"[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\nfilter_fqns = [\"layers\"]\n", mxGrouped}, nil},
		// fp8-rowwise: Float8Linear.recipe_name "rowwise" (no all-gather
		// keys: a recipe_name asserts it off) and Float8GroupedMM.fqns.
		{job.FP8Rowwise, nil, false, []string{"converters = [\"quantize.linear.float8\", \"quantize.grouped_mm.float8\"]\n",
			"[quantize.linear.float8]\nrecipe_name = \"rowwise\"\nfilter_fqns = [\"output\", \"router.gate\"]\n",
			"[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n"}, []string{"all_gather", ".mx"}},
		{job.FP8Rowwise, job.Quantize{job.QuantExperts}, false, []string{"converters = [\"quantize.grouped_mm.float8\"]\n"}, []string{"quantize.linear"}},
	} {
		e := quantExport(quantRecipe(t, c.p, c.sets, c.ag))
		var buf bytes.Buffer
		if _, err := e.TOML(&buf); err != nil {
			t.Fatalf("%s %v: %v", c.p, c.sets, err)
		}
		out := buf.String()
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s %v: output lacks\n%s\ngot:\n%s", c.p, c.sets, w, out)
			}
		}
		for _, w := range c.never {
			if strings.Contains(out, w) {
				t.Errorf("%s %v: output has %q:\n%s", c.p, c.sets, w, out)
			}
		}
		var doc map[string]any
		if _, err := toml.Decode(out, &doc); err != nil {
			t.Fatalf("%s %v: %v\n%s", c.p, c.sets, err, out)
		}
		tables := map[string]map[string]any{}
		tomlTables(doc, "", tables)
		for sec, keys := range tables {
			for k, v := range keys {
				typ, ok := schema.Sections[sec][k]
				if !ok {
					t.Errorf("%s %v: [%s] %s not in v0.2.2's schema excerpt", c.p, c.sets, sec, k)
					continue
				}
				torchtitanCheckValue(t, sec+"."+k, v, typ)
				if k != "filter_fqns" && k != "fqns" {
					continue
				}
				for _, f := range v.([]any) {
					if _, ok := schema.ModuleFQNs[f.(string)]; !ok {
						t.Errorf("%s %v: %s.%s names %q, not a module of the schema excerpt", c.p, c.sets, sec, k, f)
					}
				}
			}
		}
	}
}

// TestTorchtitanQuantPython: mxfp8 writes, for main at b5bcd76, the
// converter Configs of torchtitan/components/quantization/mx.py (read by
// hand: MXFP8LinearConverter.Config's fqns is an include list,
// MXFP8GroupedExpertsConverter.Config's recipe_name "mxfp8_rceil") and
// rebuilds the model spec with the registry function's own model_registry
// call plus converters; imports, Config fields, model_registry keywords
// and FQN fragments are all in the schema excerpt. A model with no
// registry function gets the list and a comment.
func TestTorchtitanQuantPython(t *testing.T) {
	var schema struct {
		torchtitanPySchema
		Converters    map[string]map[string]any `json:"converters"`
		ModelRegistry map[string][]string       `json:"model_registry"`
		ModuleFQNs    map[string]string         `json:"module_fqns"`
	}
	torchtitanLoad(t, "main-b5bcd76-configs.json", &schema)
	const lin = "        MXFP8LinearConverter.Config(fqns=%s, model_compile_enabled=%s),\n"
	const grouped = "        MXFP8GroupedExpertsConverter.Config(recipe_name=\"mxfp8_rceil\", pad_multiple=128, model_compile_enabled=%s),\n"
	for _, c := range []struct {
		model   string
		sets    job.Quantize
		compile memory.Compile
		want    []string
		skipped int
	}{
		{"qwen3-30b-a3b", nil, memory.Compiled, []string{
			"from torchtitan.components.quantization import MXFP8LinearConverter\n",
			"from torchtitan.components.quantization import MXFP8GroupedExpertsConverter\n",
			"from torchtitan.models.qwen3 import model_registry\n",
			"    converters = [\n" + strings.Replace(strings.Replace(lin, "%s", `["attention", "feed_forward", "shared_experts"]`, 1), "%s", "True", 1) +
				strings.Replace(grouped, "%s", "True", 1) + "    ]\n" +
				"    config.model_spec = model_registry(\"30B-A3B\", converters=converters)\n"}, 0},
		{"deepseek-moe-16b", job.Quantize{job.QuantOutput, job.QuantExperts}, memory.Compile{Loss: true}, []string{
			"from torchtitan.models.deepseek_v3 import model_registry\n",
			"        MXFP8LinearConverter.Config(fqns=[\"lm_head\"], model_compile_enabled=False),\n",
			"    config.model_spec = model_registry(\"16B\", attn_backend=\"flex\", converters=converters)\n"}, 0},
		{"llama3-8b", job.Quantize{job.QuantLinear}, memory.Compiled, []string{
			"    converters = [\n" + strings.Replace(strings.Replace(lin, "%s", `["attention", "feed_forward", "shared_experts"]`, 1), "%s", "True", 1) + "    ]\n",
			"    config.model_spec = model_registry(\"8B\", converters=converters)\n"}, 0},
		{"olmoe-1b-7b", job.Quantize{job.QuantExperts}, memory.Compiled, []string{
			"    converters = [\n" + strings.Replace(grouped, "%s", "True", 1) + "    ]\n",
			"    # Pass converters to the model's model_registry"}, 1},
	} {
		r := quantRecipe(t, job.MXFP8, c.sets, false)
		e := quantExport(r)
		e.Model, e.Compile = c.model, c.compile
		var buf bytes.Buffer
		skipped, err := e.Python(&buf)
		if err != nil {
			t.Fatalf("%s %v: %v", c.model, c.sets, err)
		}
		out := buf.String()
		if len(skipped) != c.skipped {
			t.Errorf("%s: skipped %v", c.model, skipped)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s %v: output lacks\n%s\ngot:\n%s", c.model, c.sets, w, out)
			}
		}
		checkPyQuant(t, out, schema.Imports, schema.Converters, schema.ModelRegistry, schema.ModuleFQNs)
	}
}

// TestTorchtitanQuantRowwise: fp8-rowwise writes torchao's recipe_name,
// "rowwise" or with --fp8-rowwise-gw-hp "rowwise_with_gw_hp", in v0.2.2's
// [quantize.linear.float8] and in main's Float8LinearConverter.Config
// (with filter_fqns, an exclude list: the router's gate and the head),
// and main's Float8GroupedExpertsConverter for the experts (float8.py at
// 73a0e69 and b5bcd76c, read by hand).
func TestTorchtitanQuantRowwise(t *testing.T) {
	var schema struct {
		torchtitanPySchema
		Converters    map[string]map[string]any `json:"converters"`
		ModelRegistry map[string][]string       `json:"model_registry"`
		ModuleFQNs    map[string]string         `json:"module_fqns"`
	}
	torchtitanLoad(t, "main-b5bcd76-configs.json", &schema)
	r := quantRecipe(t, job.FP8Rowwise, nil, false)
	r.FP8RowwiseGWHP = true
	e := quantExport(r)
	var toml, py bytes.Buffer
	if _, err := e.TOML(&toml); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(toml.String(), "recipe_name = \"rowwise_with_gw_hp\"\n") {
		t.Errorf("TOML lacks rowwise_with_gw_hp:\n%s", toml.String())
	}
	if _, err := e.Python(&py); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"from torchtitan.components.quantization import Float8LinearConverter\n",
		"        Float8LinearConverter.Config(recipe_name=\"rowwise_with_gw_hp\", filter_fqns=[\"lm_head\", \"router.gate\"], model_compile_enabled=True),\n",
		"        Float8GroupedExpertsConverter.Config(model_compile_enabled=True),\n"} {
		if !strings.Contains(py.String(), w) {
			t.Errorf("Python lacks\n%s\ngot:\n%s", w, py.String())
		}
	}
	checkPyQuant(t, py.String(), schema.Imports, schema.Converters, schema.ModelRegistry, schema.ModuleFQNs)
	// v0.2.2's float8 grouped GEMM asserts pp = 1 and cp = 1.
	pp := e.Point
	pp.Layout.PP = 2
	if err := TorchtitanTOML.AdmitQuant(QuantOf(r), pp, true); err == nil || !strings.Contains(err.Error(), "pipeline parallelism") {
		t.Errorf("AdmitQuant, TOML rowwise experts with pp 2: %v, want refused citing the assert", err)
	}
}

// checkPyQuant checks the converter lines of a Python export against
// main's schema excerpt.
func checkPyQuant(t *testing.T, out string, imports map[string]string, conv map[string]map[string]any, registry map[string][]string, fqns map[string]string) {
	t.Helper()
	importRE := regexp.MustCompile(`(?m)^from (torchtitan\.components\.quantization|torchtitan\.models\.\w+) import (\w+)$`)
	for _, m := range importRE.FindAllStringSubmatch(out, -1) {
		if m[2] == "model_registry" {
			if _, ok := registry[m[1]]; !ok {
				t.Errorf("model_registry imported from %s, not a package of the schema excerpt", m[1])
			}
		} else if imports[m[2]] != m[1] && !strings.HasSuffix(m[1], "config_registry") {
			t.Errorf("import %s from %s not in the schema excerpt", m[2], m[1])
		}
	}
	confRE := regexp.MustCompile(`(?m)^        (\w+\.Config)\((.*)\),$`)
	kwRE := regexp.MustCompile(`(\w+)=("[^"]*"|\d+|True|False|\[[^\]]*\])`)
	for _, m := range confRE.FindAllStringSubmatch(out, -1) {
		fields, ok := conv[m[1]]
		if !ok {
			t.Errorf("%s not in the schema excerpt", m[1])
			continue
		}
		for _, kv := range kwRE.FindAllStringSubmatch(m[2], -1) {
			typ, ok := fields[kv[1]]
			if !ok {
				t.Errorf("%s(%s=…) not in the schema excerpt", m[1], kv[1])
				continue
			}
			v := pythonLiteral(kv[2])
			torchtitanCheckValue(t, m[1]+"."+kv[1], v, typ)
			if kv[1] == "fqns" || kv[1] == "filter_fqns" {
				for _, f := range v.([]any) {
					if _, ok := fqns[f.(string)]; !ok {
						t.Errorf("%s fqns names %q, not in the schema excerpt", m[1], f)
					}
				}
			}
		}
	}
	specRE := regexp.MustCompile(`(?m)^    config\.model_spec = model_registry\(.*\)$`)
	pkgRE := regexp.MustCompile(`(?m)^from (torchtitan\.models\.\w+) import model_registry$`)
	if spec := specRE.FindString(out); spec != "" {
		pkg := pkgRE.FindStringSubmatch(out)
		if pkg == nil {
			t.Fatalf("model_registry called, not imported:\n%s", out)
		}
		for _, kw := range regexp.MustCompile(`(\w+)=`).FindAllStringSubmatch(spec, -1) {
			found := false
			for _, k := range registry[pkg[1]] {
				found = found || k == kw[1]
			}
			if !found {
				t.Errorf("%s: model_registry(%s=…) not a keyword of the schema excerpt", pkg[1], kw[1])
			}
		}
	}
}

// TestTorchtitanQuantBF16: a bf16 recipe's exports write no converter,
// byte for byte what an export without the recipe writes (the golden
// files of TestTorchtitanTOML and TestTorchtitanPython).
func TestTorchtitanQuantBF16(t *testing.T) {
	e := quantExport(job.DefaultRecipe())
	plain := e
	plain.Quant = TorchtitanQuant{}
	for _, w := range []func(TorchtitanExport, *bytes.Buffer) error{
		func(x TorchtitanExport, b *bytes.Buffer) error { _, err := x.TOML(b); return err },
		func(x TorchtitanExport, b *bytes.Buffer) error { _, err := x.Python(b); return err },
	} {
		var a, b bytes.Buffer
		if err := w(e, &a); err != nil {
			t.Fatal(err)
		}
		if err := w(plain, &b); err != nil {
			t.Fatal(err)
		}
		if a.String() != b.String() || strings.Contains(a.String(), "onverter") || strings.Contains(a.String(), "quantize") {
			t.Errorf("bf16 recipe export differs or names a converter:\n%s", a.String())
		}
	}
}

// TestTorchtitanQuantRefusals: what a target cannot write is refused,
// naming the flag and value, by CheckRecipe before a search and by the
// export (which writes nothing): fp8-current, fp8-delayed and
// fp8-blockwise in both forms (torchtitan has no TransformerEngine recipe), fp8-tensorwise in main's (its float8 is
// rowwise only, float8.py at b5bcd76c), a recipe no export writes; and,
// depending on the layout, v0.2.2's MX linears with tp > 1 under a
// compiled model (mx.py at 73a0e69), which AdmitQuant and the search's
// ExportFilter refuse too, while eager, experts-only and main's form pass.
func TestTorchtitanQuantRefusals(t *testing.T) {
	for _, c := range []struct {
		r      job.Recipe
		target TorchtitanTarget
		want   string
	}{
		{quantRecipe(t, job.FP8Current, nil, false), TorchtitanTOML, "--precision = fp8-current"},
		{quantRecipe(t, job.FP8Current, nil, false), TorchtitanPy, "--precision = fp8-current"},
		{quantRecipe(t, job.FP8Tensorwise, nil, false), TorchtitanPy, "--precision = fp8-tensorwise"},
		{quantRecipe(t, job.FP8Tensorwise, nil, true), TorchtitanPy, "--precision = fp8-tensorwise"},
		{quantRecipe(t, job.FP8Delayed, nil, false), TorchtitanTOML, "--precision = fp8-delayed"},
		{quantRecipe(t, job.FP8Delayed, nil, false), TorchtitanPy, "Megatron-LM's --fp8-recipe delayed"},
		{quantRecipe(t, job.FP8Blockwise, nil, false), TorchtitanTOML, "Megatron-LM's --fp8-recipe blockwise"},
		{quantRecipe(t, job.FP8Blockwise, nil, false), TorchtitanPy, "--precision = fp8-blockwise"},
	} {
		if err := c.target.CheckRecipe(c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s, CheckRecipe(%s): %v, want %q", c.target, c.r.Precision, err, c.want)
		}
		e := quantExport(c.r)
		var buf bytes.Buffer
		var err error
		if c.target == TorchtitanTOML {
			_, err = e.TOML(&buf)
		} else {
			_, err = e.Python(&buf)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || buf.Len() != 0 {
			t.Errorf("%s export of %s: %v (%d bytes), want a refusal naming %q", c.target, c.r.Precision, err, buf.Len(), c.want)
		}
	}
	for _, r := range []job.Recipe{quantRecipe(t, job.FP8Tensorwise, nil, true), quantRecipe(t, job.MXFP8, nil, false)} {
		if err := TorchtitanTOML.CheckRecipe(r); err != nil {
			t.Errorf("TOML, %s: %v", r.Precision, err)
		}
	}

	tp := torchtitanTPPoint(1, 4, 2, 8, 1, false, moe.AC{Mode: moe.ACFull})
	const want = "precision = mxfp8 converting linear,experts with tp = 2 and a compiled model"
	mx := QuantOf(quantRecipe(t, job.MXFP8, nil, false))
	if err := TorchtitanTOML.AdmitQuant(mx, tp, true); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "mx.py") {
		t.Errorf("AdmitQuant, TOML compiled tp 2: %v, want %q citing mx.py", err, want)
	}
	for _, c := range []struct {
		q        TorchtitanQuant
		target   TorchtitanTarget
		compiled bool
	}{
		{mx, TorchtitanTOML, false},
		{mx, TorchtitanPy, true},
		{QuantOf(quantRecipe(t, job.MXFP8, job.Quantize{job.QuantExperts}, false)), TorchtitanTOML, true},
		{QuantOf(quantRecipe(t, job.FP8Tensorwise, nil, false)), TorchtitanTOML, true},
	} {
		if err := c.target.AdmitQuant(c.q, tp, c.compiled); err != nil {
			t.Errorf("AdmitQuant(%s %v, compiled %t): %v", c.target, c.q.Converted, c.compiled, err)
		}
	}
	e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: tp, Compile: memory.Compiled, Quant: mx}
	var buf bytes.Buffer
	if _, err := e.TOML(&buf); err == nil || !strings.Contains(err.Error(), want) || buf.Len() != 0 {
		t.Errorf("TOML export, compiled tp 2: %v", err)
	}
	if _, err := e.Python(&buf); err != nil {
		t.Errorf("Python export, compiled tp 2: %v", err)
	}
	f := &ExportFilter{Targets: []TorchtitanTarget{TorchtitanTOML}, Compiled: true, Quant: mx}
	if err := f.Admit(tp); err == nil {
		t.Error("ExportFilter admitted an mxfp8 tp 2 compiled point")
	}
	if n, reasons := f.Refusals(); n != 1 || len(reasons) != 1 || !strings.HasPrefix(reasons[0].Reason, "precision = mxfp8 converting linear,experts with tp = N") {
		t.Errorf("refusals %d %+v", n, reasons)
	}
}

// TestTorchtitanQuantUnknownModel: a model v0.2.2 has no flavor for still
// gets its converters, in a [model] table of their own.
func TestTorchtitanQuantUnknownModel(t *testing.T) {
	e := quantExport(quantRecipe(t, job.MXFP8, nil, false))
	e.Model = "mixtral-8x7b"
	var buf bytes.Buffer
	skipped, err := e.TOML(&buf)
	if err != nil || len(skipped) != 2 || !strings.Contains(buf.String(), "\n[model]\nconverters = [\"quantize.linear.mx\", \"quantize.grouped_mm.mx\"]\n") {
		t.Errorf("skipped %v, %v:\n%s", skipped, err, buf.String())
	}
	var doc map[string]any
	if _, err := toml.Decode(buf.String(), &doc); err != nil {
		t.Error(err)
	}
}
