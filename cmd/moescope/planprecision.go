package main

import (
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe/job"
)

// precisionList is plan's --precision: the recipes to search, comma-
// separated (DESIGN: plan takes a list). It replaces the recipe flag's
// value; the recipe holds the first, which the flag checks resolve.
type precisionList struct {
	recipe *job.Recipe
	list   []job.Precision
}

func (p *precisionList) String() string {
	if p == nil || p.recipe == nil {
		return ""
	}
	if len(p.list) == 0 {
		return string(p.recipe.Precision)
	}
	parts := make([]string, len(p.list))
	for i, v := range p.list {
		parts[i] = string(v)
	}
	return strings.Join(parts, ",")
}

func (p *precisionList) Set(s string) error {
	p.list = nil
	for _, f := range strings.Split(s, ",") {
		v := job.Precision(strings.TrimSpace(f))
		if err := v.Check("--precision"); err != nil {
			return err
		}
		for _, have := range p.list {
			if have == v {
				return fmt.Errorf("%s listed twice", v)
			}
		}
		p.list = append(p.list, v)
	}
	p.recipe.Precision = p.list[0]
	return nil
}

// addPrecisionList makes the recipe flags' --precision a list.
func addPrecisionList(f *recipeFlags) *precisionList {
	p := &precisionList{recipe: &f.r}
	fl := f.fs.Lookup("precision")
	fl.Value = p
	fl.Usage = "training recipes to search, comma-separated, of " + strings.Join(job.BF16.Values(), "|") +
		" (priced: " + strings.Join(job.PricedNames(), ", ") + "); the best plan of each is reported and the best of all is kept"
	return p
}

// recipes are the recipes plan searches: the flags' recipe under each
// listed precision. --quantize and --fp8-all-gather apply to the
// low-precision ones, --fp8-rowwise-gw-hp to fp8-rowwise; each recipe is resolved (Set checked the precisions).
func (p *precisionList) recipes(base job.Recipe) ([]job.Recipe, error) {
	if len(p.list) <= 1 {
		return []job.Recipe{base}, nil
	}
	out := make([]job.Recipe, len(p.list))
	for i, v := range p.list {
		r := base
		r.Precision = v
		if !v.LowPrecision() {
			r.Quantize, r.FP8AllGather = nil, false
		}
		r.FP8RowwiseGWHP = r.FP8RowwiseGWHP && v == job.FP8Rowwise // torchao's variant of fp8-rowwise only
		if err := r.Resolve(); err != nil {
			return nil, fmt.Errorf("%w: --precision %s: %v", errUsage, v, err)
		}
		out[i] = r // Set checked each precision is priced
	}
	return out, nil
}
