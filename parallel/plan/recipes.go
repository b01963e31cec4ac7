package plan

import (
	"fmt"
	"io"
)

// SearchRecipes runs the search once per recipe choice on evaluators that
// differ only in it, prints each choice's best plan to w when there are
// several, and returns the evaluator and report of the choice whose best
// plan is fastest (the first on a tie); a choice with no feasible plan is
// said and skipped, and an error only when none has one.
func SearchRecipes(w io.Writer, choices []Choice, base *SimEvaluator, search func(*SimEvaluator) (*Report, error)) (*SimEvaluator, *Report, error) {
	var bestEv *SimEvaluator
	var best *Report
	var bestLabel string
	var firstErr error
	for _, c := range choices {
		r := c.Recipe
		// A fresh evaluator per recipe: its caches are keyed by point only.
		ev := &SimEvaluator{Run: base.Run, Device: base.Device, Cluster: base.Cluster, Calibration: base.Calibration}
		ev.Run.Recipe = r
		rep, err := search(ev)
		if err != nil {
			if len(choices) == 1 {
				return nil, nil, err
			}
			fmt.Fprintf(w, "%s: %v\n", c.Label, err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if len(choices) > 1 {
			fmt.Fprintf(w, "%s: best %s at %.0f TPS, MFU %.1f%% (bf16 peak)\n", c.Label, rep.Best.Point, rep.Best.Score.TPS, 100*rep.Best.Score.MFU)
		}
		if best == nil || rep.Best.Score.TPS > best.Best.Score.TPS {
			bestEv, best, bestLabel = ev, rep, c.Label
		}
	}
	if best == nil {
		return nil, nil, firstErr
	}
	if len(choices) > 1 {
		fmt.Fprintf(w, "kept: %s\n", bestLabel)
	}
	return bestEv, best, nil
}
