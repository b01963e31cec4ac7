package main

import (
	"io"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim"
)

// planJSON is one plan in --json output (DESIGN's layout keys and units).
type planJSON struct {
	GPUs                int            `json:"gpus"`
	DPShard             int            `json:"dp_shard"`
	DPReplicate         int            `json:"dp_replicate"`
	EP                  int            `json:"ep"`
	TP                  int            `json:"tp,omitempty"`  // absent = 1
	ETP                 int            `json:"etp,omitempty"` // with tp
	CP                  int            `json:"cp,omitempty"`  // absent = 1
	Sharding            job.Sharding   `json:"sharding"`
	ReshardAfterForward bool           `json:"reshard_after_forward"`
	KeepGathered        bool           `json:"keep_gathered"`
	AllreduceLastOnly   bool           `json:"allreduce_last_only"`
	GradSyncLastOnly    bool           `json:"grad_sync_last_only,omitempty"`
	PP                  int            `json:"pp,omitempty"` // absent = 1; the pipeline fields with it
	PPSchedule          job.PPSchedule `json:"pp_schedule,omitempty"`
	PPMicrobatchSize    int            `json:"pp_microbatch_size,omitempty"`
	PPVirtualStages     int            `json:"pp_virtual_stages,omitempty"`
	AC                  moe.AC         `json:"ac"`
	LBS                 int            `json:"lbs"`
	GradAccum           int            `json:"grad_accum"`
	GlobalBatch         int            `json:"global_batch"`    // sequences per optimizer step
	TokensPerStep       int64          `json:"tokens_per_step"` // global_batch × seq
	TPS                 float64        `json:"tps"`
	TPSInterval         *[2]float64    `json:"tps_interval,omitempty"`
	Indistinguishable   bool           `json:"indistinguishable_from_best,omitempty"` // its interval reaches the best's
	MFU                 float64        `json:"mfu"`
	MemoryFraction      float64        `json:"memory_fraction"`
	StepTimeS           float64        `json:"step_time_s"`
	Bottleneck          string         `json:"bottleneck"`
	Breakdown           *sim.Breakdown `json:"breakdown,omitempty"` // the best plan's only: simulate's shape
}

type planStageJSON struct {
	GPUs              int        `json:"gpus"`
	Candidates        int        `json:"candidates"`
	Pruned            int        `json:"pruned"`
	Simulated         int        `json:"simulated"`
	BestTPS           float64    `json:"best_tps"`
	ScalingEfficiency float64    `json:"scaling_efficiency"`
	Grew              string     `json:"grew,omitempty"`
	Survivors         []planJSON `json:"survivors"`
}

type planReportJSON struct {
	Model        string            `json:"model"`
	GPU          string            `json:"gpu"`
	Cluster      string            `json:"cluster"`
	GPUs         int               `json:"gpus"`
	Seq          int               `json:"seq"`
	Precision    job.Precision     `json:"precision"` // the recipe of these plans (with --precision's list: the fastest's)
	MemoryTarget float64           `json:"memory_target"`
	GlobalBatch  int               `json:"global_batch,omitempty"`
	Exhaustive   bool              `json:"exhaustive"`
	Simulated    int               `json:"simulated"`
	Stages       []planStageJSON   `json:"stages"`
	Plans        []planJSON        `json:"plans"`
	Best         planJSON          `json:"best"`
	Knobs        []plan.KnobEffect `json:"knobs,omitempty"` // what turning each setting would change for the best plan, the plan first
	CPNote       string            `json:"cp_note,omitempty"`
}

// planToJSON is r as one plan of --json, its sequences seq tokens long.
func planToJSON(r plan.Result, seq int, breakdown bool) planJSON {
	p, l := r.Point, r.Point.Layout
	j := planJSON{GPUs: l.GPUs, DPShard: l.DPShard, DPReplicate: l.DPReplicate, EP: l.EP, Sharding: l.Sharding,
		ReshardAfterForward: l.ReshardAfterForward, KeepGathered: l.KeepGathered, AllreduceLastOnly: l.AllreduceLastOnly,
		AC: p.AC, LBS: p.LBS, GradAccum: p.GradAccum, GlobalBatch: p.GlobalBatch(), TokensPerStep: int64(p.GlobalBatch()) * int64(seq),
		TPS: r.Score.TPS, MFU: r.Score.MFU, MemoryFraction: r.Score.MemoryFraction, StepTimeS: r.Score.StepTimeS,
		Bottleneck: r.Score.Bottleneck, TPSInterval: r.Score.TPSInterval, GradSyncLastOnly: l.GradSyncLastOnly,
		Indistinguishable: r.Score.Indistinguishable}
	if l.TPDegree() > 1 {
		j.TP, j.ETP = l.TPDegree(), max(l.ETP, 1)
	}
	j.CP = l.CP
	if l.Stages() > 1 {
		j.PP, j.PPSchedule, j.PPMicrobatchSize, j.PPVirtualStages = l.PP, l.PPSchedule, l.PPMicrobatchSize, l.VirtualStages()
	}
	if breakdown {
		j.Breakdown = &r.Score.Breakdown
	}
	return j
}

// planWriteJSON prints the search as plan's --json document: the best plan
// with its breakdown, and at most top plans of each stage and of the target
// scale.
func planWriteJSON(w io.Writer, a *planArgs, model, gpu, cluster string, prec job.Precision, rep *plan.Report) error {
	out := planReportJSON{Model: model, GPU: gpu, Cluster: cluster, GPUs: a.gpus, Seq: a.seq, Precision: prec, MemoryTarget: a.target,
		GlobalBatch: a.globalBatch, Exhaustive: rep.Exhaustive, Simulated: rep.Simulated, Best: planToJSON(rep.Best, a.seq, true), Knobs: rep.Knobs, CPNote: rep.CPNote}
	for _, st := range rep.Stages {
		s := planStageJSON{GPUs: st.GPUs, Candidates: st.Candidates, Pruned: st.Pruned, Simulated: st.Simulated,
			BestTPS: st.BestTPS, ScalingEfficiency: st.ScalingEfficiency, Grew: st.Grew, Survivors: []planJSON{}}
		for i, r := range st.Survivors {
			if i == a.top {
				break
			}
			s.Survivors = append(s.Survivors, planToJSON(r, a.seq, false))
		}
		out.Stages = append(out.Stages, s)
	}
	for i, r := range rep.Plans {
		if i == a.top {
			break
		}
		out.Plans = append(out.Plans, planToJSON(r, a.seq, false))
	}
	return writeJSON(w, "plan", out)
}
