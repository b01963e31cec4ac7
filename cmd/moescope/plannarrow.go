package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/moescope/moescope/parallel/plan"
)

// exportNarrowing is the search's Admit for the torchtitan exports: it
// refuses what the targets cannot express and counts the refusals by
// reason, so that plan can say how much an export request narrowed the
// search and why. The planner calls Admit from several goroutines.
type exportNarrowing struct {
	flags    []string
	targets  []plan.TorchtitanTarget
	compiled bool // the model is compiled (plan.TorchtitanAdmit's compiledModel)

	mu      sync.Mutex
	refused int
	reasons map[string]int    // reason key → candidates refused for it
	why     map[string]string // reason key → the explanation after its ':'
}

// A value after "= " is normalised out of reason keys: "sharding = ddp
// with dp_shard = 8" and "= 32" are one reason (zero1 and zero2 are not).
var reasonValue = regexp.MustCompile(`= [0-9]+`)

func (n *exportNarrowing) admit(p plan.Point) error {
	for _, t := range n.targets {
		err := plan.TorchtitanAdmit(t, p, n.compiled)
		if err == nil {
			continue
		}
		n.record(err)
		return err
	}
	return nil
}

// record counts one refused candidate under each reason its error joins
// (TorchtitanAdmit joins one error per field it cannot express).
func (n *exportNarrowing) record(err error) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.refused++
	if n.reasons == nil {
		n.reasons, n.why = map[string]int{}, map[string]string{}
	}
	for _, e := range errs {
		msg := e.Error()
		key, why, _ := strings.Cut(msg, ":")
		key = reasonValue.ReplaceAllString(key, "= N")
		n.why[key] = strings.TrimSpace(why)
		n.reasons[key]++
	}
}

// report says, when the exports refused any candidate, how many of all the
// search enumerated and for which reasons (most frequent first), e.g.
// "--torchtitan-toml narrows the search … 62 of 251 candidates left out".
func (n *exportNarrowing) report(w io.Writer, rep *plan.Report) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refused == 0 {
		return
	}
	total := 0
	for _, st := range rep.Stages {
		total += st.Candidates
	}
	names := make([]string, len(n.targets))
	for i, t := range n.targets {
		names[i] = t.String()
	}
	verb := "narrows"
	if len(n.flags) > 1 {
		verb = "narrow"
	}
	fmt.Fprintf(w, "moescope plan: %s %s the search to what %s can express: %d of %d candidates left out before simulation (%d simulated):\n",
		strings.Join(n.flags, " and "), verb, strings.Join(names, " and "), n.refused, total, rep.Simulated)
	keys := make([]string, 0, len(n.reasons))
	for k := range n.reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if n.reasons[keys[i]] != n.reasons[keys[j]] {
			return n.reasons[keys[i]] > n.reasons[keys[j]]
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Fprintf(w, "  %d × %s: %s\n", n.reasons[k], k, n.why[k])
	}
}

// newExportNarrowing returns the narrowing for the exports the flags ask
// for, or nil when none is asked for.
func newExportNarrowing(tomlPath, pyPath string, compiled bool) *exportNarrowing {
	n := &exportNarrowing{compiled: compiled}
	if tomlPath != "" {
		n.flags, n.targets = append(n.flags, "--torchtitan-toml"), append(n.targets, plan.TorchtitanTOML)
	}
	if pyPath != "" {
		n.flags, n.targets = append(n.flags, "--torchtitan-py"), append(n.targets, plan.TorchtitanPy)
	}
	if len(n.targets) == 0 {
		return nil
	}
	return n
}
