package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/numeric"
)

func init() {
	register(command{"train", "train on synthetic data with goroutine ranks (FSDP/HSDP/EP), checkpoint and resume", runTrain})
}

// trainReport is the JSON output of `moescope train`.
type trainReport struct {
	report.Run
	StartStep int       `json:"start_step"` // optimizer steps already taken (resume)
	Losses    []float64 `json:"losses"`     // cross-entropy, one per step of this run
	AuxLosses []float64 `json:"aux_losses"` // aux loss per step, ref.AuxLoss's formula for the model (0 when off)
	// TPS is a rank's own tokens per second (torchtitan's definition).
	TPS float64 `json:"tps"`
	// MFU is the model-convention FLOPs per second of all ranks together ÷
	// the all-core measured float32 FMA peak of this CPU (a fraction).
	MFU              float64          `json:"mfu"`
	ModelFLOPsStep   int64            `json:"model_flops_per_step"`
	PeakGFLOPS       float64          `json:"peak_gflops"`
	PeakBytesPerRank []int64          `json:"peak_bytes_per_rank"` // max over the run, at the modelled dtypes
	CommBytes        map[string]int64 `json:"comm_bytes"`          // bytes sent, by collective kind, summed over ranks and steps
	CommIntraBytes   int64            `json:"comm_intra_node_bytes"`
	CommInterBytes   int64            `json:"comm_inter_node_bytes"`
	Seconds          float64          `json:"seconds"`
	ExpertCounts     [][]int64        `json:"expert_counts,omitempty"` // per MoE layer and expert, the run's routed rows (numeric.Trainer.ExpertLoads): a --routing file
}

// trainArgs are train's flags.
type trainArgs struct {
	model, acFlag, ckpt, resume                  string
	lbs, seq, steps, accum                       int
	seed                                         uint64
	lr, wd, auxCoef, biasRate, peakFlag, hostGiB float64
	jsonOut, force, printSched                   bool
	lf                                           *layoutFlags
	num                                          job.Numerics // --precision, --quantize: the reference's arithmetic
	faults                                       *faultFlags
}

// trainRun is what a run of train is built from.
type trainRun struct {
	cfg    *moe.Config
	layout job.Layout
	mesh   *parallel.Mesh
	ac     moe.AC
	batch  parallel.Batch
	coef   float64 // the aux-loss coefficient in force
}

func runTrain(stdout, stderr io.Writer, args []string) error {
	a, err := parseTrainArgs(stderr, args)
	if err != nil {
		return err
	}
	if err := checkIO(a.force, []input{{Flag: "--model", Path: a.model}, {Flag: "--resume", Path: a.resume}},
		output{Flag: "--checkpoint", Path: a.ckpt, Marker: numeric.CheckpointMarker}); err != nil {
		return err
	}
	r, err := a.setup()
	if err != nil {
		return err
	}
	if r.layout.Stages() > 1 {
		return a.runPipeline(stdout, stderr, r)
	}
	if a.printSched && r.layout.CPDegree() > 1 {
		return fmt.Errorf("%w: --schedule with --cp %d: the schedule does not list the cp ranks' K/V exchanges yet", errUsage, r.layout.CP)
	} else if a.printSched {
		sched, err := parallel.BuildSchedule(parallel.ScheduleSpec{Spec: r.spec(), Mesh: r.mesh})
		if err != nil {
			return err
		}
		return sched.Print(stdout)
	}
	if err := checkHostMemory(r.cfg, r.layout.FoldCP(), memory.Batch{LBS: a.lbs, Seq: a.seq / r.layout.CPDegree(), GradAccum: a.accum}, r.ac, a.hostGiB); err != nil {
		return err
	}
	num, state, err := a.trainer(r)
	if err != nil {
		return err
	}
	progress := stdout
	if a.jsonOut {
		progress = stderr
	}
	rep, err := a.run(progress, r, num, &state)
	if err != nil {
		return err
	}
	rep.ExpertCounts = num.ExpertLoads()
	if a.ckpt != "" {
		if err := numeric.SaveTrainCheckpoint(a.ckpt, a.force, num, state); err != nil {
			return err
		}
		fmt.Fprintf(progress, "checkpoint: %s (step %d)\n", a.ckpt, num.StepIndex())
	}
	if a.jsonOut {
		return writeJSON(stdout, "train", rep)
	}
	return nil
}

// --peak-gflops bounds, so that the MFU printed is finite: an Intel 80486
// (1989) did about 1 MFLOP/s = 1e-3 GFLOP/s; a two-socket AVX-512 server
// peaks near 1e4 GFLOP/s in float32, and 1e7 is a thousand times that.
const (
	minPeakGFLOPS = 1e-3
	maxPeakGFLOPS = 1e7
)

// parseTrainArgs reads and checks train's flags.
func parseTrainArgs(stderr io.Writer, args []string) (*trainArgs, error) {
	a := &trainArgs{}
	fs := newFlags("train", stderr)
	fs.StringVar(&a.model, "model", "", "built-in model name or config.json path (required)")
	rf := addRunFlags(fs)
	rf.recipe.refuse("train runs the CPU reference in float32 and eager; the recipe prices GPU time and memory (simulate, memory)", rf.recipe.names("precision", "quantize")...)
	rf.recipe.reference = true
	a.lf = rf.layout
	fs.IntVar(&a.steps, "steps", 0, "optimizer steps to run (required)")
	fs.Uint64Var(&a.seed, "seed", 0, "seed of the initialization and of the synthetic data")
	fs.Float64Var(&a.lr, "lr", ref.TorchtitanAdamW.LR, "AdamW learning rate (torchtitan's default)")
	fs.Float64Var(&a.wd, "weight-decay", ref.TorchtitanAdamW.WeightDecay, "AdamW weight decay (torchtitan's default)")
	fs.Float64Var(&a.auxCoef, "aux-coef", -1, "aux-loss coefficient (default: the config's router_aux_loss_coef, or DeepSeek-MoE's aux_loss_alpha)")
	fs.Float64Var(&a.biasRate, "bias-update-rate", 1e-3, "selection-bias update rate γ (sigmoid routers with a bias)")
	fs.BoolVar(&a.jsonOut, "json", false, "print one JSON object at the end (progress lines go to stderr)")
	fs.StringVar(&a.ckpt, "checkpoint", "", "write a checkpoint directory here at the end")
	fs.StringVar(&a.resume, "resume", "", "continue from this checkpoint directory (any layout; same global batch)")
	fs.BoolVar(&a.force, "force", false, "overwrite an existing --checkpoint directory")
	fs.Float64Var(&a.peakFlag, "peak-gflops", 0, fmt.Sprintf("CPU peak for MFU in GFLOP/s, in [%g, %g] (0 or unset: measured, all cores)", minPeakGFLOPS, maxPeakGFLOPS))
	fs.BoolVar(&a.printSched, "schedule", false, "print one rank's program of one step (the schedule) and exit")
	fs.Float64Var(&a.hostGiB, "host-memory-gib", defaultHostMemoryGiB, "refuse runs whose float32 tensors would need more host memory than this")
	a.faults = addFaultFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	r, err := rf.recipe.recipe()
	if err != nil {
		return nil, err
	} else if setFlags(fs)["precision"] { // unset: float32, as before
		a.num = job.Numerics{Precision: r.Precision, Quantize: r.Quantize}
	}
	a.acFlag, a.lbs, a.seq, a.accum = *rf.ac, rf.batch.LBS, rf.batch.Seq, rf.batch.GradAccum
	switch {
	case a.model == "":
		return nil, fmt.Errorf("%w: --model is required", errUsage)
	case rf.batch.Validate() != nil:
		return nil, fmt.Errorf("%w: %v", errUsage, renameFields(rf.batch.Validate(), batchKeys))
	case a.steps < 1 || a.steps > 1<<20:
		return nil, fmt.Errorf("%w: --steps = %d: must be in [1, 1048576]", errUsage, a.steps)
	case !(a.lr > 0) || a.lr > 1:
		return nil, fmt.Errorf("%w: --lr = %g: must be in (0, 1]", errUsage, a.lr)
	case !(a.wd >= 0) || a.wd > 1:
		return nil, fmt.Errorf("%w: --weight-decay = %g: must be in [0, 1]", errUsage, a.wd)
	case !(a.biasRate >= 0) || a.biasRate > 1:
		return nil, fmt.Errorf("%w: --bias-update-rate = %g: must be in [0, 1]", errUsage, a.biasRate)
	case a.peakFlag != 0 && !(a.peakFlag >= minPeakGFLOPS && a.peakFlag <= maxPeakGFLOPS):
		return nil, fmt.Errorf("%w: --peak-gflops = %g: must be in [%g, %g] GFLOP/s (0 = measure)", errUsage, a.peakFlag, minPeakGFLOPS, maxPeakGFLOPS)
	case math.IsNaN(a.auxCoef) || a.auxCoef > 1:
		return nil, fmt.Errorf("%w: --aux-coef = %g: must be in [0, 1] (negative = the config's)", errUsage, a.auxCoef)
	case !(a.hostGiB > 0) || math.IsInf(a.hostGiB, 0):
		return nil, fmt.Errorf("%w: --host-memory-gib = %g: must be a finite number > 0", errUsage, a.hostGiB)
	}
	if a.ckpt != "" && a.ckpt == a.resume {
		return nil, fmt.Errorf("%w: --checkpoint and --resume name the same directory %s", errUsage, a.ckpt)
	}
	return a, nil
}

// spec is the run the goroutine ranks execute: its model, layout, batch and
// checkpointing, with the eager recipe (the CPU reference runs PyTorch's
// eager decomposition; the recipe's storage types size what a GPU would
// hold).
func (r *trainRun) spec() job.Spec {
	return job.Spec{Model: r.cfg, Layout: r.layout, AC: r.ac, Recipe: job.EagerRecipe(),
		Batch: job.Batch{LBS: r.batch.LBS, Seq: r.batch.Seq, GradAccum: r.batch.GradAccum}}
}

// setup loads the model and resolves the layout, mesh and batch.
func (a *trainArgs) setup() (*trainRun, error) {
	ac, err := moe.ParseAC(a.acFlag)
	if err != nil {
		return nil, fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	cfg, err := hf.Load(a.model)
	if err != nil {
		return nil, err
	}
	if a.lf.gpus == 0 && a.lf.dpShard == 0 {
		return nil, fmt.Errorf("%w: --gpus is required", errUsage)
	}
	layout, err := a.lf.layout(cfg)
	if err != nil {
		return nil, err
	}
	if err := refuseMegatron(layout, "train", "the numeric backend issues FSDP2's collectives in FSDP2's order"); err != nil {
		return nil, err
	}
	if cp := layout.CPDegree(); cp > 1 && (layout.TPDegree() > 1 || layout.Stages() > 1) {
		return nil, fmt.Errorf("%w: --cp = %d with --tp %d --pp %d: numeric CP ranks run without tensor or pipeline parallelism (simulate and plan price them)", errUsage, cp, layout.TPDegree(), layout.Stages())
	}
	if layout.TPDegree() > 1 || layout.CPDegree() > 1 {
		// tp with pp is refused by the layout itself.
		if err := layout.CheckSeq(a.seq); err != nil {
			return nil, fmt.Errorf("%w: --seq: %v", errUsage, err)
		}
	}
	coef := a.auxCoef
	if coef < 0 {
		coef = cfg.AuxLossCoef
	}
	if layout.Stages() > 1 {
		// One goroutine per pipeline rank (runPipeline); no mesh.
		if err := a.faults.check(layout.GPUs, a.steps); err != nil {
			return nil, err
		}
		return &trainRun{cfg: cfg, layout: layout, ac: ac, batch: parallel.Batch{LBS: a.lbs, Seq: a.seq, GradAccum: a.accum, DP: layout.DP()}, coef: coef}, nil
	}
	gpn := layout.GPUsPerNode
	if gpn == 0 {
		cl, err := hw.LoadCluster(hw.DefaultClusterName)
		if err != nil {
			return nil, err
		}
		gpn = cl.GPUsPerNode
	}
	mesh, err := parallel.NewMesh(layout.FoldCP(), cfg, gpn) // cp ranks inside dp_shard (numeric.CP)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	batch := parallel.Batch{LBS: a.lbs, Seq: a.seq, GradAccum: a.accum, DP: layout.DP()}
	if err := batch.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := a.faults.check(layout.GPUs, a.steps); err != nil {
		return nil, err
	}
	return &trainRun{cfg: cfg, layout: layout, mesh: mesh, ac: ac, batch: batch, coef: coef}, nil
}

// trainer builds the goroutine ranks from a fresh initialization or from
// the --resume checkpoint (numeric.Start), and the state a checkpoint of
// this run records.
func (a *trainArgs) trainer(r *trainRun) (*numeric.Trainer, numeric.TrainState, error) {
	adam := ref.TorchtitanAdamW
	adam.LR, adam.WeightDecay = a.lr, a.wd
	state := numeric.TrainState{Model: r.cfg.Name, Layout: r.layout, AC: r.ac.String(), LBS: a.lbs, Seq: a.seq, GradAccum: a.accum,
		GlobalBatch: r.batch.Global(), DataSeed: a.seed, AdamW: adam, AuxCoef: r.coef, BiasRate: a.biasRate}
	spec := numeric.Spec{Spec: r.spec(), Mesh: r.mesh, DataSeed: a.seed, Numerics: a.num,
		AdamW: adam, AuxCoef: r.coef, BiasRate: a.biasRate, Timeout: a.faults.timeout,
		CP: numeric.CP{Degree: r.layout.CP, Method: r.layout.CPMethod, Balancer: r.layout.CPLoadBalancer}}
	return numeric.Start(spec, state, a.seed, a.resume, a.faults.fault(0))
}

// run runs the optimizer steps, printing a line per step, and reports
// the run.
func (a *trainArgs) run(progress io.Writer, r *trainRun, num *numeric.Trainer, state *numeric.TrainState) (*trainReport, error) {
	cfg, layout, mesh, ac, batch := r.cfg, r.layout, r.mesh, r.ac, r.batch
	peak := a.peakFlag
	if peak == 0 {
		peak = kernel.MeasurePeak(0).AllCoreGFLOPS
	}
	flopsStep, err := flops.ModelPerStep(cfg, flops.Shape{Seq: a.seq, Batch: int(batch.Global())})
	if err != nil {
		return nil, err
	}
	cpNote := ""
	if cp := layout.CPDegree(); cp > 1 {
		cpNote = fmt.Sprintf("; folded dp_shard %d = dp_shard %d × cp %d (%s, %s)", layout.DPShard*cp, layout.DPShard, cp, layout.CPMethod, layout.CPLoadBalancer)
	}
	fmt.Fprintf(progress, "train %s: %s%s; ac %s, lbs %d, seq %d, grad-accum %d (global batch %d sequences)\n",
		cfg.Name, mesh, cpNote, ac, a.lbs, a.seq, a.accum, batch.Global())
	rep := trainReport{Run: report.Run{Model: cfg.Name, Layout: layout, AC: ac, LBS: a.lbs, Seq: a.seq, GradAccum: a.accum}, StartStep: num.StepIndex(),
		ModelFLOPsStep: flopsStep, PeakGFLOPS: peak, PeakBytesPerRank: make([]int64, mesh.World())}
	var total time.Duration
	ctx := context.Background()
	for s := 0; s < a.steps; s++ {
		before := num.Comm().Stats.Total()
		t0 := time.Now()
		res, err := num.Step(ctx)
		if err != nil {
			return nil, stepError(err, rep.StartStep+s+1, num.RankErrors(), a.ckpt)
		}
		dt := time.Since(t0)
		total += dt
		after := num.Comm().Stats.Total()
		var intra, inter int64
		for k, b := range after {
			intra += b.SentIntra - before[k].SentIntra
			inter += b.SentInter - before[k].SentInter
		}
		var maxPeak int64
		for r, p := range res.PeakBytes {
			rep.PeakBytesPerRank[r] = max(rep.PeakBytesPerRank[r], p)
			maxPeak = max(maxPeak, p)
		}
		rep.Losses = append(rep.Losses, res.Loss)
		rep.AuxLosses = append(rep.AuxLosses, res.Aux)
		state.Losses = append(state.Losses, res.Loss)
		// A tp rank's own tokens are 1/tp of its group's (res.Tokens are
		// already a cp rank's): torchtitan v0.2.2 (73a0e69)
		// components/metrics.py divides the tokens by
		// ParallelDims.non_data_parallel_size = cp·tp·pp.
		tps := float64(res.Tokens) / float64(layout.TPDegree()) / dt.Seconds()
		mfu := flops.MFU(float64(flopsStep)/float64(batch.Global()*int64(a.seq)), float64(batch.Global()*int64(a.seq))/dt.Seconds(), peak*1e9)
		peaks := "max " + fmtBytes(maxPeak)
		if len(res.PeakBytes) <= 8 {
			var ps []string
			for _, p := range res.PeakBytes {
				ps = append(ps, fmtBytes(p))
			}
			peaks = strings.Join(ps, ", ")
		}
		fmt.Fprintf(progress, "step %d  loss %.6f  aux %.6f  tps %.0f  mfu %.2f%%  peak/rank [%s]  comm intra %s inter %s  %.3fs\n",
			res.Step+1, res.Loss, res.Aux, tps, 100*mfu, peaks, fmtBytes(intra), fmtBytes(inter), dt.Seconds())
	}
	rep.Seconds = total.Seconds()
	rep.TPS = float64(int64(a.steps)*int64(a.lbs)*int64(a.seq)*int64(a.accum)) / float64(layout.TPDegree()*layout.CPDegree()) / total.Seconds()
	rep.MFU = flops.MFU(float64(flopsStep)/float64(batch.Global()*int64(a.seq)), float64(int64(a.steps)*batch.Global()*int64(a.seq))/total.Seconds(), peak*1e9)
	rep.CommBytes = map[string]int64{}
	for _, k := range parallel.CollKinds() {
		rep.CommBytes[string(k)] = 0
	}
	for k, b := range num.Comm().Stats.Total() {
		rep.CommBytes[string(k)] = b.Sent()
		rep.CommIntraBytes += b.SentIntra
		rep.CommInterBytes += b.SentInter
	}
	return &rep, nil
}

// checkHostMemory refuses a run whose float32 tensors would need more host
// memory than --host-memory-gib, naming the term that does not fit
// (numeric.EstimateHostMemory).
func checkHostMemory(cfg *moe.Config, l job.Layout, b memory.Batch, ac moe.AC, limitGiB float64) error {
	h, err := numeric.EstimateHostMemory(cfg, l, b, ac)
	limit := limitGiB * (1 << 30)
	switch {
	case h.Params > limit:
		return fmt.Errorf("%w: train runs on this CPU: %s (%d parameters) on %d ranks needs about %.1f GiB of host memory, over --host-memory-gib %g; use a small model such as tiny",
			errUsage, cfg.Name, h.Parameters, l.GPUs, h.Params/(1<<30), limitGiB)
	case err != nil:
		return fmt.Errorf("%w: lbs %d × seq %d: %v", errUsage, b.LBS, b.Seq, err)
	case h.Params+h.Activations > limit:
		return fmt.Errorf("%w: train runs on this CPU: lbs %d × seq %d on %d ranks need about %.1f GiB of host memory for activations (plus %.1f GiB for parameters), over --host-memory-gib %g; use a smaller --lbs or --seq",
			errUsage, b.LBS, b.Seq, l.GPUs, h.Activations/(1<<30), h.Params/(1<<30), limitGiB)
	case h.Total() > limit:
		return fmt.Errorf("%w: train runs on this CPU: %d ranks need about %.1f GiB of host memory for padded gathered weights and gradients (FSDP pads each tensor to a multiple of dp_shard = %d rows on every rank), over --host-memory-gib %g; use fewer --gpus",
			errUsage, l.GPUs, h.Total()/(1<<30), l.DPShard, limitGiB)
	}
	return nil
}

// fmtBytes prints a byte count with a binary unit.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
