package report

import (
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// LayoutOptions names a layout's options beyond its degrees, comma-separated,
// as plan's table shows them: FSDP's resharding, kept-gathered weights,
// replica all-reduce and gradient sync only on the last micro-step, tensor
// parallelism and the pipeline (pp degree, schedule × virtual stages,
// micro-batch size); "-" when it has none.
func LayoutOptions(l job.Layout) string {
	var o []string
	if l.Sharding == job.ShardFSDP && l.DPShard > 1 {
		if l.ReshardAfterForward {
			o = append(o, "reshard")
		} else {
			o = append(o, "no-reshard")
		}
	}
	if l.KeepGathered {
		o = append(o, "keep-gathered")
	}
	if l.AllreduceLastOnly {
		o = append(o, "ar-last")
	}
	if tp := l.TPDegree(); tp > 1 {
		o = append(o, fmt.Sprintf("tp%d", tp))
		if l.EP > 1 {
			o = append(o, fmt.Sprintf("etp%d", max(l.ETP, 1)))
		}
	}
	if cp := l.CPDegree(); cp > 1 {
		o = append(o, fmt.Sprintf("cp%d-%s", cp, l.CPMethod))
	}
	if l.GradSyncLastOnly {
		o = append(o, "sync-last")
	}
	if l.Stages() > 1 {
		sched := string(l.PPSchedule)
		if l.VirtualStages() > 1 {
			sched += fmt.Sprintf("×%d", l.VirtualStages())
		}
		o = append(o, fmt.Sprintf("pp%d", l.PP), sched, fmt.Sprintf("mbs%d", l.PPMicrobatchSize))
	}
	if len(o) == 0 {
		return "-"
	}
	return strings.Join(o, ",")
}

// PointName is a compact name of a point for prose: its layout (see
// layoutShort), checkpointing policy and local batch.
func PointName(p plan.Point) string {
	return layoutShort(p.Layout) + fmt.Sprintf(", %s, lbs %d", p.AC, p.LBS)
}

// layoutShort names a layout compactly: "fsdp 128×4 ep 1 no-reshard".
func layoutShort(l job.Layout) string {
	s := fmt.Sprintf("%s %d×%d ep %d", l.Sharding, l.DPShard, l.DPReplicate, l.EP)
	if o := LayoutOptions(l); o != "-" {
		s += " " + o
	}
	return s
}
