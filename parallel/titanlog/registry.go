package titanlog

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/plan"
)

// The registry form is Python; moescope reads only the statements its own
// export writes (plan.TorchtitanExport.Python): `config = <registry>()`,
// `config.<section>.<field> = <literal>`, a literal being an integer,
// a quoted string, True/False/None, a list of strings, or
// SelectiveAC.Config()/FullAC.Config() (torchtitan/distributed/
// activation_checkpoint.py at b5bcd76), and a low-precision recipe's
// `<Converter>.Config(k=<literal>, …),` lines with
// `config.model_spec = model_registry(…, converters=converters)`, and the
// loss line (regLossRE; another `config.loss = …` is refused). Other
// lines (imports, def, return, comments, `converters = [`) say nothing
// about the run.
var (
	regBaseRE   = regexp.MustCompile(`^config = ([A-Za-z_][A-Za-z0-9_]*)\(\)$`)
	regAssignRE = regexp.MustCompile(`^config\.([a-z_]+\.?[a-z_]*) = (.+)$`)
	regConvRE   = regexp.MustCompile(`^([A-Za-z0-9_]+Converter)\.Config\((.*)\),?$`)
	regSpecRE   = regexp.MustCompile(`^config\.model_spec = model_registry\((.*)\)$`)
	// The loss line plan.TorchtitanExport writes: the registry's
	// cross-entropy in N chunks, or alone.
	regLossRE = regexp.MustCompile(`^config\.loss = (?:ChunkedLossWrapper\.Config\(loss_fn=getattr\(config\.loss, "loss_fn", config\.loss\), num_chunks=(\d+)\)|getattr\(config\.loss, "loss_fn", config\.loss\))$`)
)

// ParseRegistry reads a config-registry function in moescope's export form.
func ParseRegistry(where string, data []byte) (*Job, error) {
	v := &values{where: where, m: map[string]any{}}
	base, spec := "", ""
	chunks := 0
	var convs []pyConverter
	for i, raw := range strings.Split(string(data), "\n") {
		s := strings.TrimSpace(raw)
		if k := strings.Index(s, "  #"); k >= 0 {
			s = strings.TrimSpace(s[:k])
		}
		if m := regBaseRE.FindStringSubmatch(s); m != nil {
			base = m[1]
			continue
		}
		if m := regConvRE.FindStringSubmatch(s); m != nil {
			args, err := pyArgs(m[2])
			if err != nil {
				return nil, fmt.Errorf("%s: line %d: %s.Config: %w", where, i+1, m[1], err)
			}
			convs = append(convs, pyConverter{class: m[1], args: args, line: i + 1})
			continue
		}
		if strings.HasPrefix(s, "config.model_spec = ") {
			m := regSpecRE.FindStringSubmatch(s)
			if m == nil {
				return nil, fmt.Errorf("%s: line %d: config.model_spec: moescope reads only model_registry(…, converters=converters) there", where, i+1)
			}
			spec = m[1]
			continue
		}
		if strings.HasPrefix(s, "config.loss = ") {
			m := regLossRE.FindStringSubmatch(s)
			if m == nil {
				return nil, fmt.Errorf("%s: line %d: config.loss: moescope reads only the loss line its export writes (ChunkedLossWrapper.Config(loss_fn=…, num_chunks=N) or the registry's loss_fn alone)", where, i+1)
			}
			chunks, _ = strconv.Atoi(m[1]) // "" (one piece) reads as 0
			continue
		}
		m := regAssignRE.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		val, err := pyLiteral(m[2])
		if err != nil {
			return nil, fmt.Errorf("%s: line %d: config.%s: %w", where, i+1, m[1], err)
		}
		v.m[m[1]] = val
	}
	j := &Job{Where: where, Form: FormRegistry, Precision: "bf16", LossChunks: chunks}
	if base == "" {
		v.fail("config", "(none)", "a `config = <registry function>()` line, as moescope plan --torchtitan-py writes")
	} else if name, err := plan.TorchtitanRegistryModel(base); err != nil {
		v.errs = append(v.errs, err)
	} else {
		j.Model = name
	}
	v.quantRegistry(j, convs, spec)
	v.mainTraining(j)
	v.parallelism(j)
	// A registry function's own values are unknown here: every field the
	// run depends on must be set in the file.
	if _, ok := v.m["activation_checkpoint"]; !ok {
		v.fail("config.activation_checkpoint", "(not set)", "SelectiveAC.Config(), FullAC.Config() or None: the registry function's own policy is not known to moescope")
	}
	switch ac := v.m["activation_checkpoint"]; ac {
	case nil:
		j.AC = "none"
	case pyClass("SelectiveAC"):
		j.AC = "selective"
	case pyClass("FullAC"):
		j.AC = "full"
	default:
		v.fail("config.activation_checkpoint", ac, "SelectiveAC.Config(), FullAC.Config() or None")
	}
	v.compile(j, []string{"model", "loss"})
	return j, v.err()
}

// mainTraining reads current torchtitan's token-counted batch fields
// (TrainingConfig in torchtitan/config/configs.py at b5bcd76) as sequences.
func (v *values) mainTraining(j *Job) {
	const mb, step, ctx = "training.num_tokens_per_microbatch_per_dp_rank", "training.num_tokens_per_train_step", "training.max_context_length"
	for _, k := range []string{mb, step, ctx} {
		if _, ok := v.m[k]; !ok {
			v.fail(k, "(not set)", "required: the registry function's own value is not known to moescope")
		}
	}
	j.Seq = v.int(ctx, 0)
	tokMB, tokStep := v.int(mb, 0), v.int(step, 0)
	if j.Seq < 1 {
		v.fail(ctx, j.Seq, "≥ 1 tokens")
		return
	}
	if tokMB < j.Seq || tokMB%j.Seq != 0 {
		v.fail(mb, tokMB, fmt.Sprintf("a positive multiple of max_context_length %d (moescope runs whole sequences)", j.Seq))
	}
	if tokStep%j.Seq != 0 || tokStep < 1 {
		v.fail(step, tokStep, fmt.Sprintf("a positive multiple of max_context_length %d", j.Seq))
	}
	j.LBS, j.GlobalBatch = tokMB/j.Seq, tokStep/j.Seq
}

// printedMain reads the JSON current torchtitan prints: the checkpointing
// policy's class is not in it (to_dict keeps the Config's fields only), so
// AC is left empty (noACClass refuses it as a run's only config: such a
// log needs its registry file as --job-config), and the converters are not
// read (Precision stays bf16).
func (v *values) printedMain() (*Job, error) {
	j := &Job{Where: v.where, Form: FormPrintedMain, Precision: "bf16"}
	name, flavor := v.str("model_spec.name", ""), v.str("model_spec.flavor", "")
	if m, err := plan.TorchtitanModelFor(name, flavor); err != nil {
		v.errs = append(v.errs, err)
	} else {
		j.Model = m
	}
	v.mainTraining(j)
	v.parallelism(j)
	v.compile(j, []string{"model", "loss"})
	return j, v.err()
}

// noACClass refuses main's printed form (printedMain) as the config a run
// is read with: its checkpointing policy is unknown.
func (j *Job) noACClass() error {
	if j.Form != FormPrintedMain {
		return nil
	}
	return fmt.Errorf("%s: %w", j.Where, moe.FieldError{Field: "activation_checkpoint", Value: "(a dict of fields)",
		Allowed: "named by class, which main's printed config does not keep: pass the registry file as --job-config"})
}

// pyClass is a checkpointing Config() call, as read by pyLiteral.
type pyClass string

// pyLiteral reads the literals the export writes.
func pyLiteral(s string) (any, error) {
	switch s {
	case "True":
		return true, nil
	case "False":
		return false, nil
	case "None":
		return nil, nil
	case "SelectiveAC.Config()":
		return pyClass("SelectiveAC"), nil
	case "FullAC.Config()":
		return pyClass("FullAC"), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	if q, err := strconv.Unquote(s); err == nil {
		return q, nil
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		var out []string
		for _, e := range strings.Split(strings.TrimSpace(s[1:len(s)-1]), ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			q, err := strconv.Unquote(e)
			if err != nil {
				return nil, fmt.Errorf("%s: a list of quoted strings expected", s)
			}
			out = append(out, q)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: not a literal moescope reads (int, string, True/False/None, list of strings, SelectiveAC.Config(), FullAC.Config())", s)
}
