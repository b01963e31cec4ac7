package titanlog

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// Low-precision recipes read back from job configs: the converters the
// exports write (plan.TorchtitanQuant), read into the recipe's precision,
// GEMM sets and fp8 all-gather where they say one recipe; everything else
// is refused by key.

// v0.2.2's registered converter names (register_model_converter in
// torchtitan/components/quantization/float8.py and mx.py at 73a0e69).
const (
	convFloat8Linear  = "quantize.linear.float8"
	convFloat8Grouped = "quantize.grouped_mm.float8"
	convMXLinear      = "quantize.linear.mx"
	convMXGrouped     = "quantize.grouped_mm.mx"
)

// quantV022 reads [model] converters and their [quantize.*] sections.
// Sections of converters not listed are ignored: v0.2.2's printed config
// holds all of them at their defaults.
func (v *values) quantV022(j *Job) {
	conv := v.list("model.converters")
	if len(conv) == 0 {
		return
	}
	seen := map[string]bool{}
	for _, c := range conv {
		switch {
		case seen[c]:
			v.fail("model.converters", c, "each converter once")
		case c != convFloat8Linear && c != convFloat8Grouped && c != convMXLinear && c != convMXGrouped:
			v.fail("model.converters", c, `"quantize.linear.float8" (fp8-tensorwise or fp8-rowwise) and "quantize.grouped_mm.float8" (fp8-rowwise), or "quantize.linear.mx" and "quantize.grouped_mm.mx" (mxfp8)`)
		}
		seen[c] = true
	}
	if (seen[convFloat8Linear] || seen[convFloat8Grouped]) && (seen[convMXLinear] || seen[convMXGrouped]) {
		// QuantizationConverter._validate (quantization/__init__.py).
		v.fail("model.converters", conv, "one quantization type: torchtitan refuses float8 and mx together")
		return
	}
	var sets job.Quantize
	switch {
	case seen[convFloat8Linear] || seen[convFloat8Grouped]:
		j.Precision = string(job.FP8Rowwise) // torchao's float8 grouped GEMM is rowwise
		if seen[convFloat8Linear] {
			sets = v.linearSets(j, "quantize.linear.float8", nil)
			v.float8(j, seen[convFloat8Grouped])
		}
		if seen[convFloat8Grouped] {
			v.float8Grouped()
			sets = append(sets, job.QuantExperts)
		}
	case seen[convMXLinear] || seen[convMXGrouped]:
		j.Precision = string(job.MXFP8)
		if seen[convMXLinear] {
			// MXLinear's defaults: recipe_name "mxfp8_cublas", filter_fqns
			// ["output"] (job_config.py at 73a0e69, lines 777-789).
			if r := v.str("quantize.linear.mx.recipe_name", "mxfp8_cublas"); r != "mxfp8_cublas" {
				v.fail("quantize.linear.mx.recipe_name", r, `"mxfp8_cublas" (the MX recipe moescope exports and reads)`)
			}
			sets = v.linearSets(j, "quantize.linear.mx", []string{"output"})
		}
		if seen[convMXGrouped] {
			v.mxGrouped()
			sets = append(sets, job.QuantExperts)
		}
	}
	j.Quantize = canonicalSets(job.Precision(j.Precision), sets)
}

// linearSets reads a linear converter's filter_fqns (absent: def) as the
// GEMM sets it converts: every nn.Linear whose FQN contains no entry
// (module_filter_fn, quantization/utils.py at 73a0e69). "output" leaves
// the head out, "router.gate" the router's gate, "layers" every linear
// but the head; other entries (auto_filter_small_kn included) select by
// name or shape, not by moescope's sets.
func (v *values) linearSets(j *Job, sec string, def []string) job.Quantize {
	key := sec + ".filter_fqns"
	filters := def
	if _, ok := v.m[key]; ok {
		filters = v.list(key)
	}
	linear, output, gate := true, true, false
	for _, f := range filters {
		switch f {
		case "output":
			output = false
		case "router.gate":
			gate = true
		case "layers":
			linear, gate = false, true
		default:
			v.fail(key, f, `"output", "router.gate" or "layers": moescope reads the linears and the head as sets`)
		}
	}
	if !linear && !output {
		v.fail(key, filters, "a filter that leaves some linear converted")
	}
	if !gate && j.Model != "" {
		// moescope's recipes keep the router's gate bf16; a dense model
		// has none to leave out.
		if cfg, err := hf.Load(j.Model); err == nil && cfg.IsMoE() {
			v.fail(key, filters, `a list naming "router.gate": moescope's recipes keep the router's gate in bf16`)
		}
	}
	var sets job.Quantize
	if linear {
		sets = append(sets, job.QuantLinear)
	}
	if output {
		sets = append(sets, job.QuantOutput)
	}
	return sets
}

// float8 reads [quantize.linear.float8]: tensorwise is the recipe_name
// unset (or "tensorwise") branch of Float8LinearConverter (float8.py at
// 73a0e69, lines 53-100), where the FSDP float8 all-gather applies;
// "rowwise" and "rowwise_with_gw_hp" are fp8-rowwise (j.Precision's
// default here), the second with FP8RowwiseGWHP. grouped: the float8
// grouped GEMM (rowwise) converts the experts too, which a tensorwise
// linear recipe would mix with.
func (v *values) float8(j *Job, grouped bool) {
	const sec = "quantize.linear.float8"
	recipe, named := v.m[sec+".recipe_name"]
	switch recipe {
	case "rowwise", "rowwise_with_gw_hp":
		j.FP8RowwiseGWHP = recipe == "rowwise_with_gw_hp"
	case nil, "tensorwise":
		if grouped {
			v.fail(sec+".recipe_name", recipe, `"rowwise" or "rowwise_with_gw_hp" with quantize.grouped_mm.float8 (its grouped GEMM is rowwise; moescope has no recipe mixing tensorwise linears with it)`)
		}
		j.Precision = string(job.FP8Tensorwise)
	default:
		v.fail(sec+".recipe_name", recipe, `unset, "tensorwise", "rowwise" or "rowwise_with_gw_hp"`)
	}
	if v.bool(sec+".emulate", false) {
		v.fail(sec+".emulate", true, "false: emulated float8 runs bf16 GEMMs")
	}
	ag := v.bool(sec+".enable_fsdp_float8_all_gather", false)
	pre := v.bool(sec+".precompute_float8_dynamic_scale_for_fsdp", false)
	switch {
	case ag && named && recipe != nil:
		// float8.py lines 65-69 assert this.
		v.fail(sec+".enable_fsdp_float8_all_gather", ag, "false with a recipe_name (torchtitan refuses the all-gather with a named recipe)")
	case ag && !pre:
		v.fail(sec+".precompute_float8_dynamic_scale_for_fsdp", pre, "true with enable_fsdp_float8_all_gather: moescope's fp8_all_gather is both, as torchtitan recommends for tensorwise")
	}
	// Without the all-gather the precomputed scales are unused (float8.py
	// lines 96-99).
	j.FP8AllGather = ag
}

// float8Grouped reads [quantize.grouped_mm.float8]: fqns (list[str] |
// str, comma-separated) must select the MoE modules' experts
// (Float8GroupedMM, job_config.py at 73a0e69).
func (v *values) float8Grouped() { v.expertFQNs("quantize.grouped_mm.float8") }

// mxGrouped reads [quantize.grouped_mm.mx]: fqns (list[str] | str,
// comma-separated) must select the MoE modules' experts, recipe_name is
// Literal["mxfp8"] (job_config.py at 73a0e69, lines 794-808).
func (v *values) mxGrouped() {
	const sec = "quantize.grouped_mm.mx"
	if r := v.str(sec+".recipe_name", "mxfp8"); r != "mxfp8" {
		v.fail(sec+".recipe_name", r, `"mxfp8"`)
	}
	v.expertFQNs(sec)
}

// expertFQNs reads a grouped-GEMM converter's fqns (list[str] | str,
// comma-separated), which must name the routed experts.
func (v *values) expertFQNs(sec string) {
	var fqns []string
	if s, ok := v.m[sec+".fqns"].(string); ok {
		fqns = strings.Split(s, ",")
	} else {
		fqns = v.list(sec + ".fqns")
	}
	if len(fqns) == 0 || slices.ContainsFunc(fqns, func(f string) bool { return strings.TrimSpace(f) != "experts" }) {
		v.fail(sec+".fqns", fqns, `["experts"]: the routed experts of every MoE layer (an empty list converts none)`)
	}
}

// canonicalSets orders sets as DESIGN lists them and leaves the recipe's
// default set empty, as a recipe that names none has it.
func canonicalSets(p job.Precision, sets job.Quantize) job.Quantize {
	var out job.Quantize
	for _, s := range []job.GEMMSet{job.QuantLinear, job.QuantExperts, job.QuantOutput} {
		if slices.Contains(sets, s) {
			out = append(out, s)
		}
	}
	if slices.Equal(out, job.DefaultQuantize(p)) {
		return nil
	}
	return out
}

// pyConverter is one `<Class>.Config(k=v, …),` line of a registry export.
type pyConverter struct {
	class string
	args  map[string]any
	line  int
}

// quantRegistry reads the converters of a registry export (main at
// b5bcd76c: MXFP8LinearConverter.Config and MXFP8GroupedExpertsConverter
// .Config in torchtitan/components/quantization/mx.py), which only take
// effect through `config.model_spec = model_registry(<the registry
// function's own arguments>, converters=converters)`.
func (v *values) quantRegistry(j *Job, convs []pyConverter, spec string) {
	if len(convs) == 0 && spec == "" {
		return
	}
	want := plan.TorchtitanRegistryArgs(j.Model)
	switch {
	case len(convs) == 0:
		v.fail("config.model_spec", "model_registry("+spec+")", "set only with converters listed: moescope reads model_registry(…, converters=converters)")
		return
	case spec == "":
		v.fail("config.model_spec", "(not set)", fmt.Sprintf("model_registry(%s, converters=converters): converters listed but never applied (the run would be bf16)", want))
	case j.Model != "" && (want == "" || spec != want+", converters=converters"):
		v.fail("config.model_spec", "model_registry("+spec+")", fmt.Sprintf("model_registry(%s, converters=converters): the converters apply only through the model's model_registry, called as %s's registry function calls it", want, j.Model))
	}
	var sets job.Quantize
	seen := map[string]bool{}
	for _, c := range convs {
		key := fmt.Sprintf("line %d: %s.Config", c.line, c.class)
		if seen[c.class] {
			v.fail(key, "(again)", "each converter once")
		}
		seen[c.class] = true
		switch c.class {
		case "MXFP8LinearConverter":
			sets = append(sets, v.mxLinearFQNs(key, c.args)...)
		case "MXFP8GroupedExpertsConverter":
			v.mxExperts(key, c.args)
			sets = append(sets, job.QuantExperts)
		default:
			v.fail(key, c.class, "MXFP8LinearConverter or MXFP8GroupedExpertsConverter (mxfp8): moescope reads no other converter of main")
		}
	}
	j.Precision = string(job.MXFP8)
	j.Quantize = canonicalSets(job.MXFP8, sets)
}

// mxLinearFQNs reads MXFP8LinearConverter.Config's fqns, an include list
// (mx.py at b5bcd76c, lines 54-60; empty converts every Linear, the
// router's gate too): "attention", "feed_forward" and "shared_experts"
// together are the linear set, "lm_head" the head.
func (v *values) mxLinearFQNs(key string, args map[string]any) job.Quantize {
	checkKeys(v, key, args, "fqns", "model_compile_enabled")
	fqns, _ := args["fqns"].([]string)
	linear := []string{"attention", "feed_forward", "shared_experts"}
	n := 0
	var sets job.Quantize
	for _, f := range fqns {
		switch {
		case slices.Contains(linear, f):
			n++
		case f == "lm_head":
			sets = append(sets, job.QuantOutput)
		default:
			v.fail(key+" fqns", f, `"attention", "feed_forward", "shared_experts" (the linear set, all three) or "lm_head"`)
		}
	}
	switch n {
	case len(linear):
		sets = append(sets, job.QuantLinear)
	case 0:
	default:
		v.fail(key+" fqns", fqns, `all of "attention", "feed_forward" and "shared_experts" or none: moescope converts the linears as one set`)
	}
	if len(sets) == 0 {
		v.fail(key+" fqns", fqns, "a non-empty include list (empty converts every Linear, the router's gate too)")
	}
	return sets
}

// mxExperts reads MXFP8GroupedExpertsConverter.Config (mx.py at b5bcd76c,
// lines 152-165): recipe_name is Literal["mxfp8_rceil"].
func (v *values) mxExperts(key string, args map[string]any) {
	checkKeys(v, key, args, "recipe_name", "pad_multiple", "model_compile_enabled")
	if r, ok := args["recipe_name"]; ok && r != "mxfp8_rceil" {
		v.fail(key+" recipe_name", r, `"mxfp8_rceil"`)
	}
	if p, ok := args["pad_multiple"]; ok {
		if n, isInt := p.(int64); !isInt || n < 1 {
			v.fail(key+" pad_multiple", p, "a positive integer")
		}
	}
}

// checkKeys refuses keyword arguments outside allowed (and a
// model_compile_enabled that is not a boolean).
func checkKeys(v *values, key string, args map[string]any, allowed ...string) {
	for k, x := range args {
		if !slices.Contains(allowed, k) {
			v.fail(key, k, "keywords "+strings.Join(allowed, ", "))
		}
		if _, ok := x.(bool); k == "model_compile_enabled" && !ok {
			v.fail(key+" model_compile_enabled", x, "True or False")
		}
	}
}

// pyArgs reads `k=literal, …` (pyLiteral's literals), splitting on the
// commas outside brackets and quotes.
func pyArgs(s string) (map[string]any, error) {
	out := map[string]any{}
	depth, quoted, start := 0, false, 0
	var parts []string
	for i, r := range s {
		switch {
		case r == '"' && (i == 0 || s[i-1] != '\\'):
			quoted = !quoted
		case quoted:
		case r == '[':
			depth++
		case r == ']':
			depth--
		case r == ',' && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	parts = append(parts, s[start:])
	for _, p := range parts {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, lit, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%s: keyword arguments expected", p)
		}
		x, err := pyLiteral(strings.TrimSpace(lit))
		if err != nil {
			return nil, err
		}
		out[strings.TrimSpace(k)] = x
	}
	return out, nil
}
