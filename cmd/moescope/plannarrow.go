package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// exportNarrowing is the search's plan.ExportFilter for the torchtitan
// exports the flags ask for, with the flags that asked, so that plan can
// say how much an export request narrowed the search and why.
type exportNarrowing struct {
	flags []string // one per target
	*plan.ExportFilter
}

// newExportNarrowing returns the narrowing for the exports the flags ask
// for, or nil when none is asked for.
func newExportNarrowing(tomlPath, pyPath string, compiled bool) *exportNarrowing {
	n := &exportNarrowing{ExportFilter: &plan.ExportFilter{Compiled: compiled}}
	if tomlPath != "" {
		n.flags, n.Targets = append(n.flags, "--torchtitan-toml"), append(n.Targets, plan.TorchtitanTOML)
	}
	if pyPath != "" {
		n.flags, n.Targets = append(n.flags, "--torchtitan-py"), append(n.Targets, plan.TorchtitanPy)
	}
	if len(n.Targets) == 0 {
		return nil
	}
	return n
}

// checkRecipe refuses, naming the flag, a recipe whose storage types or
// settings a target cannot write, before the search.
func (n *exportNarrowing) checkRecipe(r job.Recipe) error {
	for i, t := range n.Targets {
		x := plan.RecipeExport(r)
		_, _, err := t.CheckPrecision(x.Precision, x.ReduceDType)
		if err = errors.Join(err, t.CheckRecipe(r)); err != nil {
			return fmt.Errorf("%w: %s: %v", errUsage, n.flags[i], err)
		}
	}
	return nil
}

// report says, when the exports refused any candidate, how many of all the
// search enumerated and for which reasons (most frequent first), e.g.
// "--torchtitan-toml narrows the search … 62 of 251 candidates left out".
func (n *exportNarrowing) report(w io.Writer, rep *plan.Report) {
	refused, reasons := n.Refusals()
	if refused == 0 {
		return
	}
	total := 0
	for _, st := range rep.Stages {
		total += st.Candidates
	}
	names := make([]string, len(n.Targets))
	for i, t := range n.Targets {
		names[i] = t.String()
	}
	verb := "narrows"
	if len(n.flags) > 1 {
		verb = "narrow"
	}
	fmt.Fprintf(w, "moescope plan: %s %s the search to what %s can express: %d of %d candidates left out before simulation (%d simulated):\n",
		strings.Join(n.flags, " and "), verb, strings.Join(names, " and "), refused, total, rep.Simulated)
	for _, r := range reasons {
		fmt.Fprintf(w, "  %d × %s: %s\n", r.Count, r.Reason, r.Why)
	}
}
