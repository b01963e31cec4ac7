package main

import (
	"encoding"
	"errors"
	"flag"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// recipeFlags are the run description's recipe on the command line: one
// flag per field of job.Recipe, derived from the struct itself (its JSON
// key with dashes, or its flag tag; its help tag; DefaultRecipe's value as
// the default), so that a field added to the recipe is a flag of every
// command that predicts time or memory without another line here.
type recipeFlags struct {
	fs      *flag.FlagSet
	r       job.Recipe
	byKey   map[string]string // JSON key → flag name
	refused [][2]string       // flag name, why
	// timed: the command prices step time, which eager attention (memory
	// only) cannot be; reference: the recipe runs fake-quantised in the CPU
	// reference (train), priced or not.
	timed, reference bool
}

func addRecipeFlags(fs *flag.FlagSet) *recipeFlags {
	f := &recipeFlags{fs: fs, r: job.DefaultRecipe()}
	f.byKey = bindStruct(fs, reflect.ValueOf(&f.r).Elem())
	return f
}

// bindStruct defines a flag on every field of the struct v (its JSON key
// with dashes, or its flag tag; its help tag) and returns each JSON key's
// flag name.
func bindStruct(fs *flag.FlagSet, v reflect.Value) map[string]string {
	byKey := map[string]string{}
	for i := range v.NumField() {
		sf, fv := v.Type().Field(i), v.Field(i)
		key, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		name := sf.Tag.Get("flag")
		if name == "" {
			name = strings.ReplaceAll(key, "_", "-")
		}
		byKey[key] = name
		help := sf.Tag.Get("help")
		if e, ok := fv.Interface().(interface{ Values() []string }); ok {
			help = strings.ReplaceAll(help, "{values}", strings.Join(e.Values(), "|"))
		}
		bindField(fs, name, help, fv, sf.Tag.Get("empty") == "ok")
	}
	return byKey
}

// bindField defines flag name on the field fv by its type.
func bindField(fs *flag.FlagSet, name, help string, fv reflect.Value, emptyOK bool) {
	switch p := fv.Addr().Interface().(type) {
	case *bool:
		fs.BoolVar(p, name, *p, help)
	case *int:
		fs.IntVar(p, name, *p, help)
	case *float64:
		fs.Float64Var(p, name, *p, help)
	case encoding.TextUnmarshaler:
		fs.Var(textField{fv, name}, name, help)
	default:
		switch fv.Kind() {
		case reflect.String:
			fs.Var(stringField{fv, emptyOK}, name, help)
		case reflect.Slice:
			fs.Var(listField{fv}, name, help)
		default:
			panic(fmt.Sprintf("recipe field %s: no flag for kind %s", name, fv.Kind()))
		}
	}
}

// stringField is a flag on a field of a string type (an enum or a dtype):
// the value is checked by job.Recipe.Validate, which names the allowed ones.
type stringField struct {
	v       reflect.Value
	emptyOK bool // the field's empty value means something (the reduce type: the gradients')
}

func (s stringField) String() string {
	if !s.v.IsValid() {
		return ""
	}
	return s.v.String()
}
func (s stringField) Set(x string) error {
	if x == "" && !s.emptyOK {
		return errors.New("must not be empty")
	}
	s.v.SetString(x)
	return nil
}

// textField is a flag on a field that reads itself from text (a PyTorch
// release): its error names the flag.
type textField struct {
	v    reflect.Value
	name string
}

func (t textField) String() string {
	if !t.v.IsValid() {
		return ""
	}
	b, _ := t.v.Interface().(encoding.TextMarshaler).MarshalText()
	return string(b)
}

func (t textField) Set(x string) error {
	err := t.v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(x))
	if err != nil {
		var fe moe.FieldError
		if errors.As(err, &fe) {
			return renameFields(fe, map[string]string{fe.Field: t.name})
		}
	}
	return err
}

// listField is a flag on a comma-separated list of a string type.
type listField struct{ v reflect.Value }

func (l listField) String() string {
	if !l.v.IsValid() {
		return ""
	}
	parts := make([]string, l.v.Len())
	for i := range parts {
		parts[i] = l.v.Index(i).String()
	}
	return strings.Join(parts, ",")
}

func (l listField) Set(x string) error {
	parts := strings.Split(x, ",")
	out := reflect.MakeSlice(l.v.Type(), len(parts), len(parts))
	for i, p := range parts {
		out.Index(i).SetString(strings.TrimSpace(p))
	}
	l.v.Set(out)
	return nil
}

// refuse makes a recipe flag the command does not use an error when given,
// saying why in its help and in the error.
func (f *recipeFlags) refuse(why string, names ...string) {
	for _, n := range names {
		f.fs.Lookup(n).Usage = "not used here (refused): " + why
		f.refused = append(f.refused, [2]string{n, why})
	}
}

// recipe returns the resolved recipe, or a usage error naming each flag
// whose value is not allowed, or the first refused flag given.
func (f *recipeFlags) recipe() (job.Recipe, error) {
	set := setFlags(f.fs)
	for _, r := range f.refused {
		if set[r[0]] {
			return job.Recipe{}, fmt.Errorf("%w: --%s = %s: not used by %s: %s", errUsage, r[0], f.fs.Lookup(r[0]).Value, strings.TrimPrefix(f.fs.Name(), "moescope "), r[1])
		}
	}
	r := f.r
	err := r.Resolve()
	if err == nil && !f.reference {
		err = r.Precision.Check("precision") // every command that takes a recipe predicts with it
	}
	if err == nil && f.timed && r.Attention == job.EagerAttention {
		err = moe.FieldError{Field: "attention_kernel", Value: string(r.Attention), Allowed: "the time model prices cudnn and flash2 only (memory sizes eager attention)"}
	}
	if err != nil {
		return r, fmt.Errorf("%w: %v", errUsage, f.flagNames(err))
	}
	return r, nil
}

// flagNames rewrites the JSON keys of the recipe's field errors as the
// flags that set them.
func (f *recipeFlags) flagNames(err error) error { return renameFields(err, f.byKey) }

// renameFields rewrites the JSON keys of field errors (moe.FieldError,
// alone or joined) as the flags that set them, by flags (JSON key → flag
// name), quoting string values as the command line gave them.
func renameFields(err error, flags map[string]string) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		var fe moe.FieldError
		if errors.As(e, &fe) {
			if n, ok := flags[fe.Field]; ok {
				fe.Field = "--" + n
				if s, ok := fe.Value.(string); ok {
					fe.Value = strconv.Quote(s)
				}
				e = fe
			}
		}
		out[i] = e
	}
	return errors.Join(out...)
}

// acPolicies are --ac's values (moe.ParseAC).
const acPolicies = "none|selective|full|layer:N|modules:M,… (M: layernorm, moe_act, moe)|memory_budget:F (F in [0, 1])"

// addACFlag defines --ac, the checkpointing policy (DESIGN's contract), with
// the default def.
func addACFlag(fs *flag.FlagSet, def, note string) *string {
	help := "activation checkpointing: " + acPolicies
	if note != "" {
		help += "; " + note
	}
	return fs.String("ac", def, help)
}

// parseACFlag reads --ac.
func parseACFlag(s string) (moe.AC, error) {
	ac, err := moe.ParseAC(s)
	if err != nil {
		return ac, fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	return ac, nil
}

// addTargetFlag defines --memory-target, the fraction of device memory a
// layout may use to be within target (DESIGN's "Fits"; the planner's and
// the sweep's bound).
func addTargetFlag(fs *flag.FlagSet) *float64 {
	t := new(float64)
	fs.Float64Var(t, "memory-target", verdict.DefaultMemoryTarget, "fraction of device memory (peak reserved / capacity) a layout may use to count as within target, in (0, 1]")
	return t
}

// checkTarget refuses a --memory-target outside (0, 1] (a usage error
// wraps it).
func checkTarget(t float64) error {
	if !(t > 0 && t <= 1) {
		return fmt.Errorf("--memory-target = %v: must be in (0, 1] (a fraction of device memory)", t)
	}
	return nil
}

// runFlags are the run description of a command that takes one run: the
// layout, --ac, the batch and the recipe. Every such command (memory,
// simulate) adds them all; plan and sweep take the recipe and search the
// rest.
type runFlags struct {
	fs     *flag.FlagSet
	layout *layoutFlags
	ac     *string
	batch  job.Batch
	recipe *recipeFlags
	// searchLBS: the command searches the local batch (memory --max-lbs
	// without --lbs); the layout's smallest stands in for the checks.
	searchLBS bool
}

func addRunFlags(fs *flag.FlagSet) *runFlags {
	r := &runFlags{fs: fs, layout: addLayoutFlags(fs)}
	r.ac = addACFlag(fs, "selective", "")
	fs.IntVar(&r.batch.LBS, "lbs", 0, "sequences per data-parallel rank per micro-step (required)")
	fs.IntVar(&r.batch.Seq, "seq", 0, "tokens per sequence (required)")
	fs.IntVar(&r.batch.GradAccum, "grad-accum", 1, "micro-steps per optimizer step")
	r.recipe = addRecipeFlags(fs)
	return r
}

// runKeys name the batch's and the recipe's flags by their JSON keys.
func runKeys(f *recipeFlags) map[string]string {
	keys := maps.Clone(f.byKey)
	maps.Copy(keys, batchKeys)
	return keys
}

// batchKeys name the batch's flags by its JSON keys.
var batchKeys = map[string]string{"lbs": "lbs", "seq": "seq", "grad_accum": "grad-accum"}

// spec resolves the flags into the run of cfg; gpus-per-node comes from
// the cluster cl when the flag is left out.
func (r *runFlags) spec(cfg *moe.Config, cl *hw.Cluster) (job.Spec, error) {
	rec, err := r.recipe.recipe()
	if err != nil {
		return job.Spec{}, err
	}
	if r.searchLBS {
		r.batch.LBS = 1 // a valid batch for the checks; the layout's smallest replaces it below
	}
	if err := r.batch.Validate(); err != nil {
		return job.Spec{}, fmt.Errorf("%w: %v", errUsage, renameFields(err, batchKeys))
	}
	ac, err := parseACFlag(*r.ac)
	if err != nil {
		return job.Spec{}, err
	}
	if cl != nil && !setFlags(r.fs)["gpus-per-node"] {
		r.layout.gpusPerNode = cl.GPUsPerNode
	}
	l, err := r.layout.layout(cfg)
	if err != nil {
		return job.Spec{}, err
	}
	if r.searchLBS {
		r.batch.LBS = max(1, l.MinLBS())
	}
	s := job.Spec{Model: cfg, Layout: l, Batch: r.batch, AC: ac, Recipe: rec}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("%w: %v", errUsage, renameFields(err, runKeys(r.recipe)))
	}
	return s, nil
}

// refuseRest defines on fs, as flags refused by name, every run-description
// flag (addRunFlags) that fs does not define: a command that searches a part
// of the run (plan, sweep) answers a flag for that part with why, not with
// flag's "not defined".
func refuseRest(fs *flag.FlagSet, why string) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	addRunFlags(all)
	all.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			b, _ := f.Value.(interface{ IsBoolFlag() bool })
			fs.Var(refusedFlag{why: why, boolean: b != nil && b.IsBoolFlag()}, f.Name, "not used here (refused): "+why)
		}
	})
}

// refusedFlag is a flag whose every value is refused, saying why.
type refusedFlag struct {
	why     string
	boolean bool
}

func (r refusedFlag) String() string     { return "" }
func (r refusedFlag) IsBoolFlag() bool   { return r.boolean }
func (r refusedFlag) Set(x string) error { return errors.New("not used here: " + r.why) }

// names are the flags the recipe defines, sorted, but those in except.
func (f *recipeFlags) names(except ...string) []string {
	names := slices.DeleteFunc(slices.Collect(maps.Values(f.byKey)), func(n string) bool { return slices.Contains(except, n) })
	slices.Sort(names)
	return names
}
