package plan

import (
	"fmt"
	"io"

	"github.com/moescope/moescope/moe/job"
)

// SearchRecipes runs the search once per recipe on evaluators that differ
// only in it, prints each recipe's best plan to w when there are several,
// and returns the evaluator and report of the recipe whose best plan is
// fastest (the first on a tie); a recipe with no feasible plan is said
// and skipped, and an error only when none has one.
func SearchRecipes(w io.Writer, recipes []job.Recipe, base *SimEvaluator, search func(*SimEvaluator) (*Report, error)) (*SimEvaluator, *Report, error) {
	var bestEv *SimEvaluator
	var best *Report
	var firstErr error
	for _, r := range recipes {
		// A fresh evaluator per recipe: its caches are keyed by point only.
		ev := &SimEvaluator{Run: base.Run, Device: base.Device, Cluster: base.Cluster, Calibration: base.Calibration}
		ev.Run.Recipe = r
		rep, err := search(ev)
		if err != nil {
			if len(recipes) == 1 {
				return nil, nil, err
			}
			fmt.Fprintf(w, "precision %s: %v\n", r.Precision, err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if len(recipes) > 1 {
			fmt.Fprintf(w, "precision %s: best %s at %.0f TPS, MFU %.1f%% (bf16 peak)\n", r.Precision, rep.Best.Point, rep.Best.Score.TPS, 100*rep.Best.Score.MFU)
		}
		if best == nil || rep.Best.Score.TPS > best.Best.Score.TPS {
			bestEv, best = ev, rep
		}
	}
	if best == nil {
		return nil, nil, firstErr
	}
	if len(recipes) > 1 {
		fmt.Fprintf(w, "kept: precision %s\n", bestEv.Run.Precision)
	}
	return bestEv, best, nil
}
