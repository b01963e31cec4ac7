package validate

import (
	"fmt"
	"path/filepath"
	"strings"
)

// writeScaleOut prints the scale-out fit: every scaling series' per-GPU
// drops from its smallest run, measured and predicted (the mechanisms
// alone, with the fitted spread between nodes, and with the spread fitted
// without the run's source), then each source's estimate.
func writeScaleOut(b *strings.Builder, o ScaleOut) {
	if len(o.Series) == 0 {
		return
	}
	b.WriteString("\nscale-out: runs of one per-GPU configuration on several node counts; drop = 1 − TPS per GPU ÷ the series' smallest run's,\n" +
		"measured and predicted by the mechanisms alone, with the fitted spread between nodes, and with it fitted without the run's source\n")
	fmt.Fprintf(b, "%-32s %5s %5s %9s %11s %8s %13s\n", "run", "gpus", "nodes", "measured", "mechanisms", "fitted", "w/o source")
	for _, s := range o.Series {
		for i, r := range s.Runs {
			if i == 0 {
				fmt.Fprintf(b, "%-32.32s %5d %5d %9s %11s %8s %13s\n", r.Name, r.GPUs, r.Nodes, "ref", "", "", "")
				continue
			}
			fmt.Fprintf(b, "%-32.32s %5d %5d %8.1f%% %10.1f%% %7.1f%% %12.1f%%\n", r.Name, r.GPUs, r.Nodes,
				100*r.MeasuredDrop, 100*r.MechanismsDrop, 100*r.FittedDrop, 100*r.LeaveOneOut)
		}
	}
	for _, src := range o.Sources {
		fmt.Fprintf(b, "source %s (%d series): spread between nodes %.2f%%; fitted without it %.2f%%\n",
			filepath.Base(src.File), src.Series, 100*src.Estimate, 100*src.LeaveOneOut)
	}
	if o.NodeSpread == 0 && len(o.Sources) < minScaleSources {
		fmt.Fprintf(b, "spread between nodes: not fitted (%d independent source(s), at least %d needed): the mechanisms alone\n", len(o.Sources), minScaleSources)
	} else {
		fmt.Fprintf(b, "spread between nodes: %.2f%% (median of %d sources' estimates, their standard deviation %.2f%%)\n",
			100*o.NodeSpread, len(o.Sources), 100*o.NodeSpreadSD)
	}
	if s, m := o.LeaveOneOut, o.Mechanisms; s != nil && m != nil {
		fmt.Fprintf(b, "|predicted − measured drop|, leave-one-source-out: median %.1f, worst %.1f points over %d runs (mechanisms alone: %.1f, %.1f)\n",
			100*s.Median, 100*s.Worst, s.Runs, 100*m.Median, 100*m.Worst)
	}
}
