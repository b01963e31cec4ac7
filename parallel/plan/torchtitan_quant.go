package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe/job"
)

// Low-precision recipes in the torchtitan exports. Each target writes the
// converters of its pinned commit:
//
//   - v0.2.2 (TOML): [model] converters names registered converters
//     (register_model_converter in torchtitan/components/quantization/
//     float8.py and mx.py at 73a0e69), each configured by its
//     [quantize.<linear|grouped_mm>.<float8|mx>] section (Float8Linear,
//     MXLinear, MXGroupedMM in torchtitan/config/job_config.py at 73a0e69,
//     lines 730-836). The linear converters skip the modules whose FQN
//     contains an entry of filter_fqns (module_filter_fn in
//     components/quantization/utils.py).
//   - main (Python): converter Config objects passed to the model's
//     model_registry (MXFP8LinearConverter.Config, whose fqns is an include
//     list, and MXFP8GroupedExpertsConverter.Config in
//     torchtitan/components/quantization/mx.py at b5bcd76c).
//
// The router's gate stays bf16 under every moescope recipe, so both forms
// leave it out by name.

// TorchtitanQuant is what an export writes of a recipe's low precision.
type TorchtitanQuant struct {
	Precision job.Precision // the training recipe ("" = bf16)
	// Converted is the GEMM sets the recipe converts (job.Recipe.Converted;
	// empty = job.DefaultQuantize of Precision).
	Converted    job.Quantize
	FP8AllGather bool // job.Recipe.FP8AllGather
	GWHP         bool // job.Recipe.FP8RowwiseGWHP
}

// QuantOf is what the exports write of r's low precision.
func QuantOf(r job.Recipe) TorchtitanQuant {
	return TorchtitanQuant{Precision: r.Precision, Converted: r.Converted(), FP8AllGather: r.FP8AllGather, GWHP: r.FP8RowwiseGWHP}
}

// rowwiseRecipe is torchao's recipe_name of an fp8-rowwise run, which
// both pinned torchtitans' float8 linear converter takes (v0.2.2
// Float8Linear.recipe_name, job_config.py at 73a0e69; main
// Float8LinearConverter.Config.recipe_name, float8.py at b5bcd76c).
func (q TorchtitanQuant) rowwiseRecipe() string {
	if q.GWHP {
		return "rowwise_with_gw_hp"
	}
	return "rowwise"
}

// low says the recipe converts GEMMs (bf16 writes nothing).
func (q TorchtitanQuant) low() bool { return q.Precision.LowPrecision() }

func (q TorchtitanQuant) sets() job.Quantize {
	if len(q.Converted) == 0 {
		return job.DefaultQuantize(q.Precision)
	}
	return q.Converted
}

// flag is the sets as --quantize takes them (comma-separated), for
// messages naming the value.
func (q TorchtitanQuant) flag() string {
	names := make([]string, len(q.sets()))
	for i, s := range q.sets() {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}

func (q TorchtitanQuant) converts(s job.GEMMSet) bool { return slices.Contains(q.sets(), s) }

// linearConverter says a linear converter is needed: the head is an
// nn.Linear like the others, converted by the same converter.
func (q TorchtitanQuant) linearConverter() bool {
	return q.converts(job.QuantLinear) || q.converts(job.QuantOutput)
}

// CheckQuant refuses, naming the flag and value, the low-precision
// settings target cannot write; those that depend on the layout too are
// AdmitQuant's.
func (t TorchtitanTarget) CheckQuant(q TorchtitanQuant) error {
	switch q.Precision {
	case "", job.BF16, job.MXFP8:
	case job.FP8Tensorwise:
		if t == TorchtitanPy {
			// Float8LinearConverter.Config.recipe_name is
			// Literal["rowwise", "rowwise_with_gw_hp"] and the class has no
			// FSDP float8 all-gather (torchtitan/components/quantization/
			// float8.py at b5bcd76c, lines 53-72).
			return fmt.Errorf("--precision = fp8-tensorwise: %s has no tensorwise float8 (Float8LinearConverter.Config takes recipe_name \"rowwise\" or \"rowwise_with_gw_hp\" only, torchtitan/components/quantization/float8.py); --torchtitan-toml (v0.2.2) writes it", t)
		}
	case job.NVFP4:
		// v0.2.2 (73a0e69) has no NVFP4 converter; main (b5bcd76) has
		// torchao's NVFP4LinearConverter for linears only
		// (torchtitan/components/quantization/nvfp4.py), whose config this
		// export does not write yet.
		return fmt.Errorf("--precision = nvfp4: %s cannot express it: torchtitan v0.2.2 has no NVFP4 converter, and main's NVFP4LinearConverter (torchao's NVFP4 for linears only, torchtitan/components/quantization/nvfp4.py at b5bcd76) is not written by moescope's export; nvfp4 is TransformerEngine's recipe under Megatron-LM (--fp4-recipe nvfp4)", t)
	case job.FP8Current, job.FP8Delayed, job.FP8Blockwise:
		// torchtitan's low precision is torchao's (float8 tensorwise and
		// rowwise, MX); TransformerEngine's recipes are Megatron-LM's
		// --fp8-recipe tensorwise, delayed and blockwise
		// (megatron/core/enums.py Fp8Recipe at d98e8a64).
		return fmt.Errorf("--precision = %s: %s cannot express it: it is TransformerEngine's recipe (Megatron-LM's --fp8-recipe %s); torchtitan's float8 is torchao's (--precision fp8-tensorwise or fp8-rowwise)",
			q.Precision, t, map[job.Precision]string{job.FP8Current: "tensorwise", job.FP8Delayed: "delayed", job.FP8Blockwise: "blockwise"}[q.Precision])
	case job.FP8Rowwise:
		if t == TorchtitanPy && !q.converts(job.QuantLinear) && q.converts(job.QuantOutput) {
			return fmt.Errorf("--quantize = %s with fp8-rowwise: %s's Float8LinearConverter takes an exclude list (filter_fqns) only, and moescope does not write one that leaves every block linear out", q.flag(), t)
		}
	default:
		return fmt.Errorf("--precision = %s: the %s export writes bf16, fp8-tensorwise, fp8-rowwise and mxfp8 only", q.Precision, t)
	}
	for _, s := range q.sets() {
		if s != job.QuantLinear && s != job.QuantExperts && s != job.QuantOutput {
			return fmt.Errorf("--quantize = %s: %s converts linear layers, the head and the routed experts only", q.flag(), t)
		}
	}
	if q.Precision == job.FP8Tensorwise && q.converts(job.QuantExperts) {
		// Validate refuses it too; an export built by hand must not write
		// a set it drops.
		return fmt.Errorf("--quantize = %s with fp8-tensorwise: %s has no tensorwise grouped GEMM (quantize.grouped_mm.float8 is rowwise)", q.flag(), t)
	}
	if q.FP8AllGather && q.Precision != job.FP8Tensorwise {
		return fmt.Errorf("--fp8-all-gather = true with precision %s: torchtitan's float8 all-gather is tensorwise only", q.Precision)
	}
	return nil
}

// AdmitQuant returns nil when target can run p under q with a compiled
// model (compiledModel) or eager. v0.2.2's MXLinearConverter asserts
// "TP not yet supported with torch.compile for mxfp8" when the model is
// compiled and tensor_parallel_degree > 1
// (torchtitan/components/quantization/mx.py at 73a0e69, lines 46-52);
// main's MXFP8LinearConverter has no such assert. Neither pinned MX
// grouped-GEMM converter requires compile (both only warn) or refuses
// pipeline parallelism (v0.2.2's Float8GroupedMMConverter asserts pp = 1
// and cp = 1, float8.py lines 192-198, but no export writes it: it is
// rowwise).
func (t TorchtitanTarget) AdmitQuant(q TorchtitanQuant, p Point, compiledModel bool) error {
	if t == TorchtitanTOML && q.Precision == job.FP8Rowwise && q.converts(job.QuantExperts) && (p.Layout.Stages() > 1 || p.Layout.CPDegree() > 1) {
		return fmt.Errorf("precision = fp8-rowwise converting experts with pp = %d, cp = %d: %s refuses it (Float8GroupedMMConverter asserts \"Float8 MoE training prototype does not yet support pipeline parallelism\" and context parallelism, torchtitan/components/quantization/float8.py at 73a0e69); use --quantize linear or the config-registry form",
			p.Layout.Stages(), p.Layout.CPDegree(), t)
	}
	if t != TorchtitanTOML || q.Precision != job.MXFP8 || !q.linearConverter() || p.Layout.TPDegree() < 2 || !compiledModel {
		return nil
	}
	return fmt.Errorf("precision = mxfp8 converting %s with tp = %d and a compiled model: %s refuses it (MXLinearConverter asserts \"TP not yet supported with torch.compile for mxfp8\", torchtitan/components/quantization/mx.py at 73a0e69); use --compile=false, --quantize experts or the config-registry form",
		q.flag(), p.Layout.TPDegree(), t)
}

// quoted is a list literal of quoted strings (TOML and Python alike).
func quoted(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// tomlConverters is v0.2.2's [model] converters for q (nil under bf16):
// the registered names of float8.py and mx.py at 73a0e69
// (register_model_converter). Both of a run's converters must be of one
// type (QuantizationConverter._validate, quantization/__init__.py).
func (q TorchtitanQuant) tomlConverters() []string {
	var out []string
	switch q.Precision {
	case job.FP8Tensorwise:
		out = append(out, "quantize.linear.float8")
	case job.FP8Rowwise:
		if q.linearConverter() {
			out = append(out, "quantize.linear.float8")
		}
		if q.converts(job.QuantExperts) {
			out = append(out, "quantize.grouped_mm.float8")
		}
	case job.MXFP8:
		if q.linearConverter() {
			out = append(out, "quantize.linear.mx")
		}
		if q.converts(job.QuantExperts) {
			out = append(out, "quantize.grouped_mm.mx")
		}
	}
	return out
}

// tomlFilterFQNs is v0.2.2's filter_fqns for the linear converters: the
// modules left bf16, matched as substrings of each module's FQN
// (module_filter_fn, components/quantization/utils.py at 73a0e69). The
// router's gate is always left out ("router.gate": MoE.router =
// TokenChoiceTopKRouter, whose gate is the nn.Linear, models/moe/moe.py),
// the head ("output", the decoders' model.py) unless converted. A set of
// the head alone leaves out "layers": every other linear of torchtitan's
// decoders lives in the layers ModuleDict (qwen3, llama3 and deepseek_v3
// model/model.py at 73a0e69), the router's gate among them.
func (q TorchtitanQuant) tomlFilterFQNs() []string {
	if !q.converts(job.QuantLinear) {
		return []string{"layers"}
	}
	if q.converts(job.QuantOutput) {
		return []string{"router.gate"}
	}
	return []string{"output", "router.gate"}
}

// writeTOML writes v0.2.2's quantize sections for q (nothing under bf16).
func (q TorchtitanQuant) writeTOML(b *strings.Builder) {
	switch q.Precision {
	case job.FP8Tensorwise:
		// Tensorwise is the recipe_name-unset branch of
		// Float8LinearConverter (float8.py at 73a0e69, lines 85-100):
		// a recipe_name asserts that the FSDP float8 all-gather is off
		// (lines 65-69), and its "tensorwise" gives the same
		// Float8LinearConfig. torchtitan recommends the all-gather and the
		// precomputed scales together for tensorwise (job_config.py
		// Float8Linear); both apply only when dp_shard > 1 (lines 87-99).
		fmt.Fprintf(b, "\n# fp8-tensorwise: torchao float8 with dynamic tensorwise scaling (recipe_name unset; torchtitan/components/quantization/float8.py at %s)\n", TorchtitanTOMLCommit[:7])
		b.WriteString("[quantize.linear.float8]\n")
		fmt.Fprintf(b, "enable_fsdp_float8_all_gather = %t\nprecompute_float8_dynamic_scale_for_fsdp = %t\n", q.FP8AllGather, q.FP8AllGather)
		fmt.Fprintf(b, "filter_fqns = %s\n", quoted(q.tomlFilterFQNs()))
	case job.FP8Rowwise:
		fmt.Fprintf(b, "\n# fp8-rowwise: torchao float8 with dynamic rowwise scaling (torchtitan/components/quantization/float8.py at %s)\n", TorchtitanTOMLCommit[:7])
		if q.linearConverter() {
			// A recipe_name with the FSDP float8 all-gather off, as
			// Float8LinearConverter asserts (float8.py at 73a0e69).
			fmt.Fprintf(b, "[quantize.linear.float8]\nrecipe_name = %q\n", q.rowwiseRecipe())
			fmt.Fprintf(b, "filter_fqns = %s\n", quoted(q.tomlFilterFQNs()))
		}
		if q.converts(job.QuantExperts) {
			// Float8GroupedMM.fqns: "experts" matches each MoE's
			// GroupedExperts (job_config.py at 73a0e69).
			if q.linearConverter() {
				b.WriteString("\n")
			}
			b.WriteString("[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n")
		}
	case job.MXFP8:
		fmt.Fprintf(b, "\n# mxfp8: OCP MX FP8 (torchtitan/components/quantization/mx.py at %s)\n", TorchtitanTOMLCommit[:7])
		if q.linearConverter() {
			// MXLinear.recipe_name's default, the cuBLAS MX GEMM
			// (job_config.py at 73a0e69, line 777).
			b.WriteString("[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\n")
			fmt.Fprintf(b, "filter_fqns = %s\n", quoted(q.tomlFilterFQNs()))
		}
		if q.converts(job.QuantExperts) {
			// MXGroupedMM.fqns defaults to none; "experts" matches each
			// MoE's GroupedExperts (MoE.experts, models/moe/moe.py),
			// recipe_name is Literal["mxfp8"] (job_config.py line 795).
			if q.linearConverter() {
				b.WriteString("\n")
			}
			b.WriteString("[quantize.grouped_mm.mx]\nrecipe_name = \"mxfp8\"\nfqns = [\"experts\"]\n")
		}
	}
}

// pyLinearFQNs is main's MXFP8LinearConverter.Config.fqns for q, an
// include list matched as substrings of the config tree's FQNs
// (mx.py at b5bcd76c, lines 79-83; an empty list converts every Linear,
// the router's gate included, so none is written empty). "attention",
// "feed_forward" and "shared_experts" are the linear set, as main's own
// deepseek_v3_debugmodel_mxfp8 lists them (models/deepseek_v3/
// config_registry.py), leaving moe.router.gate and the head out;
// "lm_head" is the head (Decoder.Config.lm_head, models/common/decoder.py).
func (q TorchtitanQuant) pyLinearFQNs() []string {
	var out []string
	if q.converts(job.QuantLinear) {
		out = append(out, "attention", "feed_forward", "shared_experts")
	}
	if q.converts(job.QuantOutput) {
		out = append(out, "lm_head")
	}
	return out
}

// pyConverters returns main's converter classes to import and the
// Config(...) expressions for q (none under bf16).
func (q TorchtitanQuant) pyConverters(compiledModel bool) (classes, configs []string) {
	compiled := map[bool]string{true: "True", false: "False"}[compiledModel]
	if q.Precision == job.FP8Rowwise {
		return q.pyRowwise(compiled)
	}
	if q.Precision != job.MXFP8 {
		return nil, nil
	}
	if q.linearConverter() {
		classes = append(classes, "MXFP8LinearConverter")
		configs = append(configs, fmt.Sprintf("MXFP8LinearConverter.Config(fqns=%s, model_compile_enabled=%s)", quoted(q.pyLinearFQNs()), compiled))
	}
	if q.converts(job.QuantExperts) {
		// recipe_name is Literal["mxfp8_rceil"]; pad_multiple 128 because
		// "the CuTeDSL quantization kernel on sm_100 requires multiples of
		// 128" (MXFP8GroupedExpertsConverter.Config, mx.py at b5bcd76c,
		// lines 152-165), as main's deepseek_v3_debugmodel_mxfp8 sets it;
		// MXFP8 needs SM100 or later (has_cuda_capability(10, 0)).
		classes = append(classes, "MXFP8GroupedExpertsConverter")
		configs = append(configs, fmt.Sprintf("MXFP8GroupedExpertsConverter.Config(recipe_name=\"mxfp8_rceil\", pad_multiple=128, model_compile_enabled=%s)", compiled))
	}
	return classes, configs
}

// pyRowwise is pyConverters for fp8-rowwise: main's Float8LinearConverter
// with the recipe and an exclude list (filter_fqns, matched as substrings
// by module_filter_fn) of the router's gate and, unless converted, the
// head; Float8GroupedExpertsConverter, which has no option of its own,
// for the experts (torchtitan/components/quantization/float8.py at
// b5bcd76c, lines 53-72 and 216-245).
func (q TorchtitanQuant) pyRowwise(compiled string) (classes, configs []string) {
	if q.converts(job.QuantLinear) {
		filter := []string{"lm_head", "router.gate"}
		if q.converts(job.QuantOutput) {
			filter = filter[1:]
		}
		classes = append(classes, "Float8LinearConverter")
		configs = append(configs, fmt.Sprintf("Float8LinearConverter.Config(recipe_name=%q, filter_fqns=%s, model_compile_enabled=%s)", q.rowwiseRecipe(), quoted(filter), compiled))
	}
	if q.converts(job.QuantExperts) {
		classes = append(classes, "Float8GroupedExpertsConverter")
		configs = append(configs, fmt.Sprintf("Float8GroupedExpertsConverter.Config(model_compile_enabled=%s)", compiled))
	}
	return classes, configs
}
