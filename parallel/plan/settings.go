package plan

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// searchSetting is a setting of the stack a search can vary (plan's
// --search-settings) with the values it tries, in the order they are
// tried: apply sets value i on a recipe and label names a recipe's.
type searchSetting struct {
	name   string
	values int
	apply  func(r *job.Recipe, i int)
	label  func(r job.Recipe) string
	moe    bool // only for a MoE model
}

// searchSettings are the settings --search-settings takes.
var searchSettings = []searchSetting{
	{"compile", 2, func(r *job.Recipe, i int) { r.Compile, r.CompileComponents = i == 0, nil },
		func(r job.Recipe) string { return flagName("compile", r.Compile) }, false},
	{"loss-chunks", 2, func(r *job.Recipe, i int) { r.LossChunks = []int{1, chunkedLoss}[i] },
		func(r job.Recipe) string { return fmt.Sprintf("--loss-chunks %d", max(r.LossChunks, 1)) }, false},
	{"dispatcher", 3, func(r *job.Recipe, i int) { r.Dispatcher = []job.Dispatcher{job.AllToAll, job.DeepEP, job.HybridEP}[i] },
		func(r job.Recipe) string { return "--dispatcher " + string(r.Dispatcher) }, true},
	{"reduce-dtype", 2, func(r *job.Recipe, i int) { r.ReduceDType = []moe.DType{moe.F32, moe.BF16}[i] },
		func(r job.Recipe) string { return "--reduce-dtype " + string(r.ReduceDType) }, false},
	{"cuda-graphs", 3, func(r *job.Recipe, i int) {
		r.CUDAGraphs = []job.CUDAGraphs{job.NoGraphs, job.LayerGraphs, job.FullGraphs}[i]
	},
		func(r job.Recipe) string { return "--cuda-graphs " + string(cmp.Or(r.CUDAGraphs, job.NoGraphs)) }, false},
	{"fused-qkv", 2, func(r *job.Recipe, i int) { r.FusedQKV = i == 1 },
		func(r job.Recipe) string { return flagName("fused-qkv", r.FusedQKV) }, false},
}

// SearchSettingNames lists the settings --search-settings takes.
func SearchSettingNames() []string {
	var out []string
	for _, s := range searchSettings {
		out = append(out, s.name)
	}
	return out
}

// Choice is one recipe a search runs on, with its label.
type Choice struct {
	Label  string
	Recipe job.Recipe
}

// SettingChoices is every combination of base's recipes (labelled by their
// precision) with the values of the named settings (SearchSettingNames),
// each resolved. A name not known, given twice, or the dispatcher on a
// dense model, is an error naming it.
func SettingChoices(base []job.Recipe, names []string, isMoE bool) ([]Choice, error) {
	var out []Choice
	for _, r := range base {
		out = append(out, Choice{Label: "--precision " + string(r.Precision), Recipe: r})
	}
	for k, name := range names {
		i := slices.IndexFunc(searchSettings, func(s searchSetting) bool { return s.name == name })
		switch {
		case i < 0:
			return nil, fmt.Errorf("--search-settings: %q is not a setting (allowed: %s)", name, strings.Join(SearchSettingNames(), ", "))
		case slices.Contains(names[:k], name):
			return nil, fmt.Errorf("--search-settings: %s listed twice", name)
		case searchSettings[i].moe && !isMoE:
			return nil, fmt.Errorf("--search-settings: %s applies to MoE models only", name)
		}
		s := searchSettings[i]
		var next []Choice
		for _, c := range out {
			for v := range s.values {
				r := c.Recipe
				s.apply(&r, v)
				next = append(next, Choice{Label: c.Label + ", " + s.label(r), Recipe: r})
			}
		}
		out = next
	}
	for i := range out {
		if err := out[i].Recipe.Resolve(); err != nil {
			return nil, fmt.Errorf("%s: %w", out[i].Label, err)
		}
	}
	return out, nil
}
