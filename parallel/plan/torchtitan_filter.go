package plan

import (
	"errors"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// ExportFilter is the search's Admit (Request.Admit) for torchtitan
// exports: it refuses the points one of Targets cannot express
// (TorchtitanAdmit, and AdmitQuant for the recipe's converters) and counts
// the refusals by reason, so that a caller can say how much an export
// narrowed the search and why. The planner calls Admit from several
// goroutines.
type ExportFilter struct {
	Targets  []TorchtitanTarget
	Compiled bool            // the model is compiled (TorchtitanAdmit's compiledModel)
	Quant    TorchtitanQuant // the recipe's low precision (QuantOf; zero: bf16)

	mu      sync.Mutex
	refused int
	reasons map[string]int    // reason → candidates refused for it
	why     map[string]string // reason → the explanation after its ':'
}

// Refusal is one reason an ExportFilter refused candidates for.
type Refusal struct {
	// Reason is the field and value a target cannot express, as
	// TorchtitanAdmit's error names them before the ':', with every
	// number after "= " written N: "sharding = ddp with dp_shard = 8" and
	// "= 32" are one reason (zero1 and zero2 are not).
	Reason string
	Why    string // the explanation after the ':' (the last one recorded)
	Count  int    // candidates refused for it
}

// reasonValue matches the values Refusal.Reason normalises out.
var reasonValue = regexp.MustCompile(`= [0-9]+`)

// Admit returns nil when every target can express p, else the first
// refusing target's TorchtitanAdmit and AdmitQuant errors, counted under
// each reason they join.
func (f *ExportFilter) Admit(p Point) error {
	for _, t := range f.Targets {
		err := errors.Join(TorchtitanAdmit(t, p, f.Compiled), t.AdmitQuant(f.Quant, p, f.Compiled))
		if err == nil {
			continue
		}
		f.record(err)
		return err
	}
	return nil
}

// record counts one refused candidate under each reason its error joins
// (TorchtitanAdmit joins one error per field it cannot express, and Admit
// joins that with AdmitQuant's).
func (f *ExportFilter) record(err error) {
	errs := joined(err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused++
	if f.reasons == nil {
		f.reasons, f.why = map[string]int{}, map[string]string{}
	}
	for _, e := range errs {
		key, why, _ := strings.Cut(e.Error(), ":")
		key = reasonValue.ReplaceAllString(key, "= N")
		f.why[key] = strings.TrimSpace(why)
		f.reasons[key]++
	}
}

// joined is the errors err joins, nested joins flattened.
func joined(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, joined(e)...)
	}
	return out
}

// Refusals returns how many candidates Admit refused and the reasons, the
// most frequent first (ties in the order of their text). A candidate
// refused for two reasons counts once in refused and once under each.
func (f *ExportFilter) Refusals() (refused int, reasons []Refusal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, n := range f.reasons {
		reasons = append(reasons, Refusal{Reason: k, Why: f.why[k], Count: n})
	}
	sort.Slice(reasons, func(i, j int) bool {
		if reasons[i].Count != reasons[j].Count {
			return reasons[i].Count > reasons[j].Count
		}
		return reasons[i].Reason < reasons[j].Reason
	})
	return f.refused, reasons
}
