package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel/numeric"
)

// runPipeline is train under --pp > 1: numeric.PipelineTrainer, one
// goroutine per (pipeline rank, replica × FSDP × tp rank of its stage; ep
// borrows the FSDP ranks, and the tp ranks at etp 1). It prints the step lines train prints
// (loss, aux, tps, mfu), without the per-rank memory and collective bytes
// the pipeline trainer does not account yet.
func (a *trainArgs) runPipeline(stdout, stderr io.Writer, r *trainRun) error {
	for _, f := range []struct {
		set        bool
		flag, what string
	}{
		{a.ckpt != "", "--checkpoint", "checkpoints"}, {a.resume != "", "--resume", "resuming"},
		{a.printSched, "--schedule", "printing the single-program schedule (simulate --pp prints the pipeline)"},
		{a.faults.failRank >= 0 || a.faults.stallRank >= 0, "--fail-rank/--stall-rank", "fault injection"},
	} {
		if f.set {
			return fmt.Errorf("%w: %s with --pp = %d: %s under pipelines are not built", errUsage, f.flag, r.layout.PP, f.what)
		}
	}
	cfg := r.cfg
	// Every rank holds a whole float32 copy of the model here (it uses its
	// stages' tensors only) and at most lbs sequences of activations in
	// flight: gpus replicas of one rank.
	host := job.Layout{GPUs: r.layout.GPUs, DPShard: 1, DPReplicate: r.layout.GPUs, EP: 1, Sharding: job.ShardDDP}
	if err := checkHostMemory(cfg, host, memory.Batch{LBS: a.lbs, Seq: a.seq, GradAccum: a.accum}, r.ac, a.hostGiB); err != nil {
		return err
	}
	adam := ref.TorchtitanAdamW
	adam.LR, adam.WeightDecay = a.lr, a.wd
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		return err
	}
	m.InitRandom(a.seed)
	num, err := numeric.NewPipelineTrainer(numeric.PipelineSpec{Spec: r.spec(),
		DataSeed: a.seed, AdamW: adam, AuxCoef: r.coef, BiasRate: a.biasRate}, m.Tensors())
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	progress := stdout
	if a.jsonOut {
		progress = stderr
	}
	peak := a.peakFlag
	if peak == 0 {
		peak = kernel.MeasurePeak(0).AllCoreGFLOPS
	}
	global := r.batch.Global()
	flopsStep, err := flops.ModelPerStep(cfg, flops.Shape{Seq: a.seq, Batch: int(global)})
	if err != nil {
		return err
	}
	l := r.layout
	fmt.Fprintf(progress, "train %s: pp %d (%s, %d stage(s) per rank, micro-batches of %d) × dp_replicate %d × dp_shard %d (FSDP inside each stage) × tp %d%s; ac %s, lbs %d, seq %d, grad-accum %d (global batch %d sequences)\n",
		cfg.Name, l.PP, l.PPSchedule, l.VirtualStages(), l.PPMicrobatchSize, l.DPReplicate, l.DPShard, l.TPDegree(), l.EPBorrowing(), r.ac, a.lbs, a.seq, a.accum, global)
	rep := trainReport{Run: report.Run{Model: cfg.Name, Layout: l, AC: r.ac, LBS: a.lbs, Seq: a.seq, GradAccum: a.accum},
		ModelFLOPsStep: flopsStep, PeakGFLOPS: peak, CommBytes: map[string]int64{}}
	var total time.Duration
	tokens := float64(global * int64(a.seq))
	for range a.steps {
		t0 := time.Now()
		res, err := num.Step(context.Background())
		if err != nil {
			return err
		}
		dt := time.Since(t0)
		total += dt
		rep.Losses = append(rep.Losses, res.Loss)
		rep.AuxLosses = append(rep.AuxLosses, res.Aux)
		// torchtitan's TPS divides the tokens by pp and tp too.
		tps := float64(res.Tokens) / float64(l.PP*l.TPDegree()) / dt.Seconds()
		mfu := flops.MFU(float64(flopsStep)/tokens, tokens/dt.Seconds(), peak*1e9)
		fmt.Fprintf(progress, "step %d  loss %.6f  aux %.6f  tps %.0f  mfu %.2f%%  %.3fs\n", res.Step+1, res.Loss, res.Aux, tps, 100*mfu, dt.Seconds())
	}
	rep.Seconds = total.Seconds()
	rep.TPS = float64(int64(a.steps)*int64(a.lbs)*int64(a.seq)*int64(a.accum)) / float64(l.PP*l.TPDegree()) / total.Seconds()
	rep.MFU = flops.MFU(float64(flopsStep)/tokens, float64(a.steps)*tokens/total.Seconds(), peak*1e9)
	if a.jsonOut {
		return writeJSON(stdout, "train", rep)
	}
	return nil
}
