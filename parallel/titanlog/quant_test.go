package titanlog

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// quantCase is a recipe to round-trip: precision, sets (nil: default) and
// the fp8 all-gather.
type quantCase struct {
	p    job.Precision
	sets job.Quantize
	ag   bool
}

func (c quantCase) recipe(t *testing.T) job.Recipe {
	t.Helper()
	r := job.DefaultRecipe()
	r.Precision, r.Quantize, r.FP8AllGather = c.p, c.sets, c.ag
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	return r
}

// quantExport writes recipe r's export of an 8-GPU plan of model in target's
// form.
func quantExport(t *testing.T, model string, r job.Recipe, target plan.TorchtitanTarget) string {
	t.Helper()
	e := plan.RecipeExport(r)
	e.Model, e.Seq = model, 4096
	e.Point = plan.Point{Layout: job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true},
		AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, GradAccum: 1}
	var buf bytes.Buffer
	var err error
	if target == plan.TorchtitanTOML {
		_, err = e.TOML(&buf)
	} else {
		_, err = e.Python(&buf)
	}
	if err != nil {
		t.Fatalf("%s, %s %v: %v", target, r.Precision, r.Quantize, err)
	}
	return buf.String()
}

// TestQuantRoundTrip: every recipe an export writes reads back, from the
// TOML and (mxfp8) the registry form, as the same recipe: precision,
// converted GEMM sets and fp8 all-gather, in the job and in the run built
// from it.
func TestQuantRoundTrip(t *testing.T) {
	tomlCases := []quantCase{
		{job.BF16, nil, false},
		{job.FP8Tensorwise, nil, false},
		{job.FP8Tensorwise, nil, true},
		{job.FP8Tensorwise, job.Quantize{job.QuantLinear, job.QuantOutput}, true},
		{job.FP8Tensorwise, job.Quantize{job.QuantOutput}, false},
		{job.MXFP8, nil, false},
		{job.MXFP8, job.Quantize{job.QuantExperts}, false},
		{job.MXFP8, job.Quantize{job.QuantLinear}, false},
		{job.MXFP8, job.Quantize{job.QuantOutput, job.QuantExperts}, false},
		{job.MXFP8, job.Quantize{job.QuantLinear, job.QuantExperts, job.QuantOutput}, false},
	}
	for _, model := range []string{"qwen3-30b-a3b", "deepseek-moe-16b"} {
		for _, c := range tomlCases {
			r := c.recipe(t)
			targets := []plan.TorchtitanTarget{plan.TorchtitanTOML}
			if c.p != job.FP8Tensorwise {
				targets = append(targets, plan.TorchtitanPy)
			}
			for _, target := range targets {
				src := quantExport(t, model, r, target)
				var j *Job
				var err error
				if target == plan.TorchtitanTOML {
					j, err = ParseTOML("x.toml", []byte(src))
				} else {
					j, err = ParseRegistry("x.py", []byte(src))
				}
				if err != nil {
					t.Fatalf("%s %s %v: %v\n%s", target, c.p, c.sets, err, src)
				}
				got := job.Recipe{Precision: job.Precision(j.Precision), Quantize: j.Quantize, FP8AllGather: j.FP8AllGather}
				if !sameRecipe(got, r) {
					t.Errorf("%s %s %s %v ag %t: read back %s %v ag %t", model, target, c.p, c.sets, c.ag, got.Precision, got.Converted(), got.FP8AllGather)
				}
				run, err := j.run("b200")
				if err == nil {
					err = run.Resolve()
				}
				if err != nil || !sameRecipe(run.Recipe, r) || run.Precision != string(r.Precision) {
					t.Errorf("%s %s %s %v: run %s %v, %v", model, target, c.p, c.sets, run.Precision, run.Recipe.Converted(), err)
				}
			}
		}
	}
}

func sameRecipe(a, b job.Recipe) bool {
	sa, sb := slices.Clone(a.Converted()), slices.Clone(b.Converted())
	slices.Sort(sa)
	slices.Sort(sb)
	return a.Precision == b.Precision && slices.Equal(sa, sb) && a.FP8AllGather == b.FP8AllGather
}

// TestQuantPrinted: v0.2.2's printed config holds every quantize section
// at its defaults (job_config.py at 73a0e69: Float8Linear.recipe_name
// None, MXLinear's filter_fqns ["output"]); only the listed converters'
// sections count, and a dense model needs no router filter.
func TestQuantPrinted(t *testing.T) {
	const printed = `{"model": {"name": "qwen3", "flavor": "30B-A3B", "converters": %s},
 "training": {"local_batch_size": 2, "seq_len": 4096},
 "parallelism": {"data_parallel_shard_degree": 8},
 "quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": false, "precompute_float8_dynamic_scale_for_fsdp": false, "recipe_name": null, "filter_fqns": [], "emulate": false},
   "mx": {"mxfp8_dim1_cast_kernel_choice": "triton", "recipe_name": "mxfp8_cublas", "filter_fqns": %s}},
  "grouped_mm": {"float8": {"fqns": []}, "mx": {"recipe_name": "mxfp8", "fqns": ["experts"]}}}}`
	for _, c := range []struct {
		conv, mxFilter string
		p              job.Precision
		sets           job.Quantize
		err            string
	}{
		{`[]`, `["output"]`, job.BF16, nil, ""},
		{`["quantize.linear.mx", "quantize.grouped_mm.mx"]`, `["output", "router.gate"]`, job.MXFP8, nil, ""},
		{`["quantize.grouped_mm.mx"]`, `["output"]`, job.MXFP8, job.Quantize{job.QuantExperts}, ""},
		// MXLinear's default filter leaves the router's gate converted.
		{`["quantize.linear.mx"]`, `["output"]`, "", nil, `quantize.linear.mx.filter_fqns = [output]: a list naming "router.gate"`},
	} {
		doc := strings.Replace(strings.Replace(printed, "%s", c.conv, 1), "%s", c.mxFilter, 1)
		j, err := parseJSONConfig("printed.json", []byte(doc))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.conv, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.conv, err)
		}
		if j.Precision != string(c.p) || !slices.Equal(j.Quantize, c.sets) {
			t.Errorf("%s: %s %v, want %s %v", c.conv, j.Precision, j.Quantize, c.p, c.sets)
		}
	}
	// llama3-8b is dense: torchtitan's own filter_fqns = ["output"]
	// (train_configs/llama3_8b.toml) is fp8-tensorwise on the linears.
	j, err := ParseTOML("x.toml", []byte("[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]\n"+
		"[quantize.linear.float8]\nenable_fsdp_float8_all_gather = false\nprecompute_float8_dynamic_scale_for_fsdp = false\nfilter_fqns = [\"output\"]\n"))
	if err != nil || j.Precision != "fp8-tensorwise" || j.Quantize != nil {
		t.Errorf("llama3 8B float8: %+v, %v", j, err)
	}
}

// TestQuantRefusals: what no moescope recipe says is refused by key.
func TestQuantRefusals(t *testing.T) {
	const head = "[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n"
	const f8 = head + "converters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\n"
	for in, want := range map[string]string{
		head + "converters = [\"quantize.grouped_mm.float8\"]\n": "quantize.grouped_mm.float8.fqns",
		head + "converters = [\"quantize.linear.float8\", \"quantize.grouped_mm.float8\"]\n[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n[quantize.linear.float8]\nfilter_fqns = [\"output\", \"router.gate\"]\n": "recipe_name",
		head + "converters = [\"float8\"]\n":                                                                                                                          "model.converters = float8",
		head + "converters = [\"quantize.linear.float8\", \"quantize.linear.mx\"]\n":                                                                                  "one quantization type",
		f8 + "recipe_name = \"rowwise_fast\"\nfilter_fqns = [\"output\", \"router.gate\"]\n":                                                                          "quantize.linear.float8.recipe_name = rowwise_fast",
		f8 + "emulate = true\nfilter_fqns = [\"output\", \"router.gate\"]\n":                                                                                          "quantize.linear.float8.emulate",
		f8 + "enable_fsdp_float8_all_gather = true\nfilter_fqns = [\"output\", \"router.gate\"]\n":                                                                    "precompute_float8_dynamic_scale_for_fsdp = false",
		f8 + "recipe_name = \"tensorwise\"\nenable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\nfilter_fqns = [\"router.gate\"]\n": "enable_fsdp_float8_all_gather = true",
		f8 + "filter_fqns = [\"output\"]\n":                                                                                                                           `a list naming "router.gate"`,
		f8 + "filter_fqns = [\"auto_filter_small_kn\", \"router.gate\"]\n":                                                                                            "filter_fqns = auto_filter_small_kn",
		f8 + "filter_fqns = [\"layers\", \"output\"]\n":                                                                                                               "leaves some linear converted",
		f8 + "filter_fqns = [\"attention.wq\", \"output\", \"router.gate\"]\n":                                                                                        "filter_fqns = attention.wq",
		head + "converters = [\"quantize.grouped_mm.mx\"]\n":                                                                                                          "quantize.grouped_mm.mx.fqns",
		head + "converters = [\"quantize.grouped_mm.mx\"]\n[quantize.grouped_mm.mx]\nfqns = [\"moe\"]\n":                                                              "quantize.grouped_mm.mx.fqns",
		head + "converters = [\"quantize.linear.mx\"]\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_emulated\"\nfilter_fqns = [\"output\", \"router.gate\"]\n":         "recipe_name = mxfp8_emulated",
	} {
		if _, err := ParseTOML("x.toml", []byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", in, err, want)
		}
	}
	// fp8-rowwise: torchao's recipe_name "rowwise" or "rowwise_with_gw_hp"
	// on the linears, the float8 grouped GEMM (rowwise) on the experts
	// (job_config.py at 73a0e69, Float8Linear and Float8GroupedMM).
	rowwise := head + "converters = [\"quantize.linear.float8\", \"quantize.grouped_mm.float8\"]\n[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n" +
		"[quantize.linear.float8]\nrecipe_name = \"rowwise_with_gw_hp\"\nfilter_fqns = [\"output\", \"router.gate\"]\n"
	if j, err := ParseTOML("x.toml", []byte(rowwise)); err != nil || j.Precision != "fp8-rowwise" || !j.FP8RowwiseGWHP ||
		len(j.Quantize) != 0 {
		t.Errorf("rowwise_with_gw_hp with grouped float8: %+v, %v; want fp8-rowwise, gw_hp, its default sets (linear, experts)", j, err)
	}
	// A string of fqns is split on commas (MXGroupedMM.fqns: list[str] | str).
	if j, err := ParseTOML("x.toml", []byte(head+"converters = [\"quantize.grouped_mm.mx\"]\n[quantize.grouped_mm.mx]\nfqns = \"experts\"\n")); err != nil ||
		j.Precision != "mxfp8" || !slices.Equal(j.Quantize, job.Quantize{job.QuantExperts}) {
		t.Errorf("fqns as a string: %+v, %v", j, err)
	}

	if _, err := ParseRegistry("x.py", []byte("config = qwen3_30b_a3b()\nconfig.model_spec = model_registry(\"30B-A3B\", converters=converters)\n")); err == nil ||
		!strings.Contains(err.Error(), "set only with converters listed") {
		t.Errorf("model_spec without converters: %v", err)
	}

	r := quantCase{job.MXFP8, nil, false}.recipe(t)
	py := quantExport(t, "qwen3-30b-a3b", r, plan.TorchtitanPy)
	const linear = `MXFP8LinearConverter.Config(fqns=["attention", "feed_forward", "shared_experts"], model_compile_enabled=True)`
	const spec = `    config.model_spec = model_registry("30B-A3B", converters=converters)` + "\n"
	if !strings.Contains(py, linear) || !strings.Contains(py, spec) {
		t.Fatalf("export changed:\n%s", py)
	}
	for _, c := range []struct{ old, new, want string }{
		{spec, "", "config.model_spec = (not set)"},
		{spec, strings.Replace(spec, `"30B-A3B"`, `"235B-A22B"`, 1), `config.model_spec = model_registry("235B-A22B", converters=converters)`},
		{spec, "    config.model_spec = my_spec()\n", "config.model_spec: moescope reads only model_registry"},
		{linear, `Float8LinearConverter.Config(filter_fqns=["lm_head", "router.gate"])`, "MXFP8LinearConverter or MXFP8GroupedExpertsConverter"},
		{linear, `MXFP8LinearConverter.Config(fqns=["attention"])`, "all of"},
		{linear, `MXFP8LinearConverter.Config(fqns=[])`, "non-empty include list"},
		{linear, `MXFP8LinearConverter.Config(fqns=["attention", "feed_forward", "shared_experts"], recipe_name="mxfp8_cublas")`, "keywords fqns, model_compile_enabled"},
		{`recipe_name="mxfp8_rceil"`, `recipe_name="mxfp8"`, `recipe_name = mxfp8`},
	} {
		src := strings.Replace(py, c.old, c.new, 1)
		if _, err := ParseRegistry("x.py", []byte(src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q → %q: err = %v, want %q", c.old, c.new, err, c.want)
		}
	}
}

// TestQuantAgree: a job config and a printed config that differ in the
// recipe disagree by name.
func TestQuantAgree(t *testing.T) {
	bf16, err := ParseTOML("bf16.toml", []byte(quantExport(t, "qwen3-30b-a3b", job.DefaultRecipe(), plan.TorchtitanTOML)))
	if err != nil {
		t.Fatal(err)
	}
	mx, err := ParseTOML("mx.toml", []byte(quantExport(t, "qwen3-30b-a3b", quantCase{job.MXFP8, job.Quantize{job.QuantExperts}, false}.recipe(t), plan.TorchtitanTOML)))
	if err != nil {
		t.Fatal(err)
	}
	err = agree("l.log", bf16, mx)
	if err == nil || !strings.Contains(err.Error(), "precision: bf16 in bf16.toml, mxfp8 in mx.toml") || !strings.Contains(err.Error(), "quantize:  in bf16.toml, experts in mx.toml") {
		t.Errorf("agree: %v", err)
	}
}
