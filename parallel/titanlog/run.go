package titanlog

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/published"
)

// Input is one log to turn into a run: the log, the job config given
// beside it (nil: the one the log printed), the device it ran on and the
// logged steps to drop.
type Input struct {
	Log     *Log
	Job     *Job // --job-config; nil to use Log.Config
	Device  hw.Device
	Cluster string // "" = the device's usual cluster
	Skip    int
}

// Run returns the measured run a log records, in the published-runs
// schema, and notes on what was skipped. The job config and the config the
// log printed, when both are there, must agree on every field moescope
// reads; the capacity the log reports must be the device's.
func (in Input) Run() (published.Run, []string, error) {
	lg := in.Log
	job := in.Job
	if lg.Config != nil {
		if k, v, ok := placeholderIn("", lg.Config); ok {
			return published.Run{}, nil, fmt.Errorf("%s: the config printed at line %d still holds a placeholder, %s = %q: "+
				"the run did not read a filled-in job config (fill each %s…> value and rerun it)", lg.Name, lg.ConfigLine, k, v, plan.Placeholder)
		}
		printed, err := FromPrinted(fmt.Sprintf("%s: the config printed at line %d", lg.Name, lg.ConfigLine), lg.Config)
		if err == nil && job == nil {
			err = printed.noACClass()
		}
		switch {
		case job == nil && err != nil:
			return published.Run{}, nil, err
		case job == nil:
			job = printed
		case err == nil:
			if err := agree(lg.Name, job, printed); err != nil {
				return published.Run{}, nil, err
			}
		}
	}
	if job == nil {
		return published.Run{}, nil, fmt.Errorf("%s: no job config: the log prints none (set job.print_config, or debug.print_config on main) and no --job-config was given for it", lg.Name)
	}
	job, err := lg.checkFacts(job)
	if err != nil {
		return published.Run{}, nil, err
	}
	if err := in.checkDevice(); err != nil {
		return published.Run{}, nil, err
	}
	st, err := lg.Steady(in.Skip)
	if err != nil {
		return published.Run{}, nil, err
	}
	r, err := job.run(in.Device.Name)
	if err != nil {
		return published.Run{}, nil, err
	}
	r.Cluster = in.Cluster
	r.TPS = st.TPS
	peak := int64(math.Round(st.PeakReservedGiB * hw.GiB))
	if peak > 0 {
		r.PeakReservedBytes = &peak
	}
	if st.MFU != nil && *st.MFU > 0 && *st.MFU <= 1 {
		r.MFU = st.MFU
	}
	r.Source = fmt.Sprintf("torchtitan log %s (median tps of steps %d–%d, %d kept; first %d logged step(s) dropped); job config %s",
		lg.Name, st.First, st.Last, st.Kept, in.Skip, job.Where)
	if err := r.Validate(true); err != nil {
		return published.Run{}, nil, fmt.Errorf("%s: %w", lg.Name, err)
	}
	if err := r.Resolve(); err != nil {
		return published.Run{}, nil, fmt.Errorf("%s: %w", lg.Name, err)
	}
	return r, lg.Notes, nil
}

// checkDevice compares the capacity the log reports, else the one its
// memory percentages imply, with the device's.
func (in Input) checkDevice() error {
	lg := in.Log
	capGiB, how := lg.CapacityGiB, "reports"
	if capGiB == 0 {
		for _, s := range lg.Steps {
			if s.MemoryPct >= 1 {
				capGiB, how = 100*s.MemoryGiB/s.MemoryPct, fmt.Sprintf("implies (memory %.2fGiB = %.2f%%, line %d)", s.MemoryGiB, s.MemoryPct, s.Line)
				break
			}
		}
	}
	if capGiB == 0 {
		return nil
	}
	dev := in.Device.MemoryGiB()
	// Printed to two decimals: a percentage ≥ 1% gives the capacity to
	// better than 0.5%; a different device differs by far more.
	if math.Abs(capGiB/dev-1) > 0.005 {
		return fmt.Errorf("%s: the log %s a device of %.2f GiB, but --gpu %s has %.2f GiB: name the GPU the run used", lg.Name, how, capGiB, in.Device.Name, dev)
	}
	return nil
}

// run is the job as a run of the published-runs schema on gpu (TPS and
// source still to fill).
func (j *Job) run(gpu string) (published.Run, error) {
	if j.DPShard == -1 {
		return published.Run{}, fmt.Errorf("%s: parallelism.data_parallel_shard_degree = -1 (the rest of the world): the GPU count is not in the config; set the degree", j.Where)
	}
	if j.DPShard < 1 || j.DPReplicate < 1 || j.EP < 1 || j.LBS < 1 || j.Seq < 1 {
		return published.Run{}, fmt.Errorf("%s: data_parallel_shard_degree %d, data_parallel_replicate_degree %d, expert_parallel_degree %d, local batch %d, seq %d: each must be ≥ 1",
			j.Where, j.DPShard, j.DPReplicate, j.EP, j.LBS, j.Seq)
	}
	dp := j.DPShard * j.DPReplicate
	accum := 1
	if j.GlobalBatch > 0 {
		if j.GlobalBatch%(j.LBS*dp) != 0 {
			return published.Run{}, fmt.Errorf("%s: global batch %d sequences: must be a multiple of local batch %d × data-parallel degree %d (torchtitan/train.py)",
				j.Where, j.GlobalBatch, j.LBS, dp)
		}
		accum = j.GlobalBatch / (j.LBS * dp)
	}
	ac, err := moe.ParseAC(j.AC)
	if err != nil {
		return published.Run{}, fmt.Errorf("%s: %w", j.Where, err)
	}
	r := published.Run{Model: j.Model, GPU: gpu, Spec: published.Defaults(), Precision: j.Precision,
		Framework: "torchtitan", FrameworkVersion: j.version()}
	r.GPUs, r.DPShard, r.DPReplicate, r.EP = dp*max(j.TP, 1), j.DPShard, j.DPReplicate, j.EP
	r.AC, r.LBS, r.Seq, r.GradAccum = ac, j.LBS, j.Seq, accum
	if j.TP > 1 {
		r.TP, r.ETP, r.AsyncTP = j.TP, j.ETP, j.AsyncTP
	}
	if j.DPShard == 1 {
		r.Sharding = job.ShardDDP
	}
	// Resolve sets the recipe's precision from r.Precision and checks the
	// GEMM sets and the all-gather against it.
	r.Quantize, r.FP8AllGather, r.FP8RowwiseGWHP = j.Quantize, j.FP8AllGather, j.FP8RowwiseGWHP
	r.ReshardAfterForward, r.Compile, r.LossChunks = j.ReshardAfterForward, j.Compile, j.LossChunks
	if j.Compile && !(j.CompileModel && j.CompileLoss) {
		if j.CompileModel {
			r.CompileComponents = append(r.CompileComponents, job.ModelComponent)
		}
		if j.CompileLoss {
			r.CompileComponents = append(r.CompileComponents, job.LossComponent)
		}
		if len(r.CompileComponents) == 0 {
			r.Compile = false
		}
	}
	return r, nil
}

func (j *Job) version() string {
	if j.Form == FormTOML {
		return plan.TorchtitanTOMLTag
	}
	return "main " + plan.TorchtitanPyCommit[:7]
}

// agree reports every field on which two job configs of one run, log's
// --job-config a and the config it printed b, differ (ErrMismatch).
func agree(log string, a, b *Job) error {
	type pair struct {
		name string
		x, y any
	}
	fields := []pair{
		{"model", a.Model, b.Model}, {"local batch (sequences)", a.LBS, b.LBS}, {"global batch (sequences)", a.globalBatch(), b.globalBatch()},
		{"seq", a.Seq, b.Seq}, {"data_parallel_replicate_degree", a.DPReplicate, b.DPReplicate},
		{"data_parallel_shard_degree", a.DPShard, b.DPShard}, {"expert_parallel_degree", a.EP, b.EP},
		{"fsdp_reshard_after_forward", a.ReshardAfterForward, b.ReshardAfterForward}, {"activation checkpointing", a.AC, b.AC},
		{"compile.enable", a.Compile, b.Compile}, {"compile model", a.CompileModel, b.CompileModel}, {"compile loss", a.CompileLoss, b.CompileLoss},
		{"tensor_parallel_degree", a.TP, b.TP},
		{"precision", a.Precision, b.Precision}, {"quantize", a.converted(), b.converted()}, {"fp8_all_gather", a.FP8AllGather, b.FP8AllGather},
		{"fp8_rowwise_gw_hp", a.FP8RowwiseGWHP, b.FP8RowwiseGWHP},
	}
	if b.Form == FormPrintedMain {
		// Main's printed form keeps neither the checkpointing policy's
		// class nor is its converters' form read (printedMain): compare
		// the fields before them.
		fields = slices.DeleteFunc(fields, func(f pair) bool {
			return slices.Contains([]string{"activation checkpointing", "precision", "quantize", "fp8_all_gather"}, f.name)
		})
	}
	var errs []error
	for _, f := range fields {
		if f.x != f.y {
			errs = append(errs, fmt.Errorf("%s: %v in %s, %v in %s", f.name, f.x, a.Where, f.y, b.Where))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: log %s, job config %s: the job config and the config the log printed differ (was the log made with another config? give the configs in the logs' order):\n  %s",
		ErrMismatch, log, a.Where, strings.ReplaceAll(errors.Join(errs...).Error(), "\n", "\n  "))
}

// converted is the GEMM sets the job's recipe converts, the default made
// explicit (job.Recipe.Converted).
func (j *Job) converted() string {
	return job.Recipe{Precision: job.Precision(j.Precision), Quantize: j.Quantize}.Converted().String()
}

// globalBatch is the sequences per optimizer step, the default (-1 in
// v0.2.2: local batch × data-parallel degree) made explicit.
func (j *Job) globalBatch() int {
	if j.GlobalBatch == 0 {
		return j.LBS * j.DPShard * j.DPReplicate
	}
	return j.GlobalBatch
}

// RunLayout is the simulator input of the job's layout on the device (the
// log is not read): what a sweep's job is predicted to do.
func (in Input) RunLayout() (sim.Input, published.Run, error) {
	r, err := in.Job.run(in.Device.Name)
	if err != nil {
		return sim.Input{}, published.Run{}, err
	}
	r.Cluster = in.Cluster
	si, err := published.InputForRun(r)
	return si, r, err
}
