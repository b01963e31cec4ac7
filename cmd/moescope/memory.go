package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/epbuffer"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
)

func init() {
	register(command{"memory", "per-GPU memory of a training step: state, activations, transients, peak reserved, max local batch", runMemory})
}

// memoryReport is the JSON output of `moescope memory`.
type memoryReport struct {
	Model              string           `json:"model"`
	GPU                string           `json:"gpu"`
	Layout             job.Layout       `json:"layout"`
	AC                 moe.AC           `json:"ac"`
	Attention          string           `json:"attention"`
	LossChunks         int              `json:"loss_chunks"`
	Compile            memory.Compile   `json:"compile"`
	ExpandableSegments bool             `json:"expandable_segments"`
	LossDType          moe.DType        `json:"loss_dtype"`
	LBS                int              `json:"lbs"`
	Seq                int              `json:"seq"`
	GradAccum          int              `json:"grad_accum"`
	PeakAllocatedBytes int64            `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64            `json:"peak_reserved_bytes"`
	DeviceBytes        int64            `json:"device_bytes"`
	MemoryFraction     float64          `json:"memory_fraction"`
	Breakdown          map[string]int64 `json:"breakdown"`
	State              memory.State     `json:"state"`
	// SavedBytesPerLayer is each decoder block's saved activations.
	SavedBytesPerLayer []int64 `json:"saved_bytes_per_layer"`
	PeakEvent          string  `json:"peak_event"`
	// ReservedByStream is the simulated cache of each CUDA stream.
	ReservedByStream map[memory.Stream]int64 `json:"reserved_by_stream"`
	Allocator        string                  `json:"allocator"`
	MaxLBS           *int                    `json:"max_lbs,omitempty"`
	MemoryTarget     float64                 `json:"memory_target,omitempty"`
	// Under pipeline parallelism: every pipeline rank's peak, and the rank
	// the rest of the report describes (the worst, which decides fits;
	// its units are the ones saved_bytes_per_layer lists).
	PipelineStages []memory.StagePeak `json:"pipeline_stages,omitempty"`
	WorstStage     *int               `json:"worst_stage,omitempty"`
	// Fit: whether the step fits the device and the memory target (JSON
	// fits, headroom_bytes, within_target).
	verdict.Fit
}

func runMemory(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("memory", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (required)")
	gpu := fs.String("gpu", hw.DefaultDeviceName, "device whose memory the step is judged against: "+strings.Join(hw.DeviceNames(), ", "))
	rf := addRunFlags(fs)
	rf.layout.refuse("gpus-per-node", "a rank's memory does not depend on how ranks are grouped into hosts (simulate and plan use it)")
	rf.recipe.refuse("it changes step time, not memory (simulate and plan use it)", "expert-gemm", "fused-elementwise", "fused-qkv", "torch-version")
	rf.recipe.refuse("the memory of dropped or padded expert rows is not modelled yet (simulate and plan price their time)", "capacity-factor", "pad-to-capacity")
	fs.Lookup("lbs").Usage = "sequences per data-parallel rank per micro-step (required unless --max-lbs)"
	jsonOut := fs.Bool("json", false, "print one JSON object")
	maxLBS := fs.Bool("max-lbs", false, "also report the largest lbs whose peak reserved fits the memory target")
	target := addTargetFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := rf.layout.checkRefused(); err != nil {
		return err
	}
	if err := checkTarget(*target); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	searchOnly := *maxLBS && !setFlags(fs)["lbs"]
	rf.searchLBS = searchOnly
	dev, err := hw.LookupDevice(*gpu)
	if err != nil {
		return fmt.Errorf("%w: --gpu: %v", errUsage, err)
	}
	cfg, err := loadModel(*model)
	if err != nil {
		return err
	}
	spec, err := rf.spec(cfg, nil)
	if err != nil {
		return err
	}
	l := spec.Layout
	if err := refuseMegatron(l, "memory", "the memory model holds FSDP2's buffers, and Megatron's FSDP keeps its embedding and output layer gathered for the step"); err != nil {
		return err
	}
	if err := dev.Runs(spec.Precision); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if f := spec.Routing.File(); f != "" {
		counts, err := sim.RoutingCounts(f, cfg)
		if err != nil {
			return err
		}
		spec.Routing, spec.ExpertSkew = job.RoutingBalanced, sim.CountsSkew(counts, spec)
	}
	o := memory.OptionsOf(spec.Recipe, spec.AC)
	rep := memoryReport{Model: cfg.Name, GPU: dev.Name, Layout: l, AC: spec.AC, Attention: string(o.Attention), LossChunks: spec.LossChunks,
		LBS: spec.LBS, Seq: spec.Seq, GradAccum: spec.GradAccum, DeviceBytes: dev.MemoryBytes,
		Compile: o.Compile, ExpandableSegments: spec.ExpandableSegments, LossDType: spec.LossDType}
	var r memory.Report
	if *maxLBS {
		n, rm, err := memory.MaxLBS(cfg, l, spec.Seq, spec.GradAccum, o, dev.MemoryBytes, *target)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		rep.MaxLBS, rep.MemoryTarget = &n, *target
		if searchOnly {
			// The report is at the largest fitting batch, or at the
			// smallest the layout runs when none fits.
			r, rep.LBS = rm, max(n, l.MinLBS())
		}
	}
	if !searchOnly {
		if r, err = memory.EstimateRun(spec, nil); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	rep.fill(cfg, dev, r)
	outside, err := epbuffer.Outside(dev, spec, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	rep.Fit, rep.MemoryTarget = verdict.Judge(r.Peak.Reserved, outside, dev.MemoryBytes, *target), *target
	if *jsonOut {
		return writeJSON(stdout, "memory", rep)
	}
	printMemory(stdout, rep)
	return nil
}

// fill copies the estimate r into the report.
func (rep *memoryReport) fill(cfg *moe.Config, dev hw.Device, r memory.Report) {
	rep.PeakAllocatedBytes, rep.PeakReservedBytes = r.Peak.Allocated, r.Peak.Reserved
	rep.MemoryFraction = float64(r.Peak.Reserved) / float64(dev.MemoryBytes)
	rep.Breakdown, rep.State = r.Breakdown(), r.State
	for i, u := range r.Units {
		if u.Layer >= 0 && u.Layer < cfg.Layers {
			rep.SavedBytesPerLayer = append(rep.SavedBytesPerLayer, r.Saved[i])
		}
	}
	if r.Peak.Index >= 0 {
		rep.PeakEvent = r.Events[r.Peak.Index].String()
	}
	rep.ReservedByStream = r.Peak.ReservedByStream
	rep.Allocator = memory.DefaultAllocator.Source
	if len(r.Stages) > 0 {
		rep.PipelineStages, rep.WorstStage = r.Stages, &r.Stage
	}
}

func printMemory(w io.Writer, r memoryReport) {
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	if line := r.Fit.Line(); line != "" {
		fmt.Fprintln(w, line)
	}
	pp, tp := "", ""
	if r.Layout.Stages() > 1 {
		pp = fmt.Sprintf("pp %d × ", r.Layout.PP)
	}
	if l := r.Layout; l.TPDegree() > 1 {
		tp = fmt.Sprintf(" × tp %d (sequence parallel; etp %d)", l.TPDegree(), l.ETP)
	}
	if l := r.Layout; l.CPDegree() > 1 {
		tp = fmt.Sprintf(" × cp %d (%s, %s)", l.CPDegree(), l.CPMethod, l.CPLoadBalancer) + tp
	}
	fmt.Fprintf(w, "%s on %s: gpus %d = %sdp_replicate %d × dp_shard %d%s, ep %d, sharding %s; ac %s, %s attention; lbs %d × seq %d, grad-accum %d\n",
		r.Model, r.GPU, r.Layout.GPUs, pp, r.Layout.DPReplicate, r.Layout.DPShard, tp, r.Layout.EP, r.Layout.Sharding,
		r.AC, r.Attention, r.LBS, r.Seq, r.GradAccum)
	if l := r.Layout; l.Stages() > 1 {
		fmt.Fprintf(w, "pipeline: %s, %d stage(s) per rank, micro-batches of %d sequence(s), %s p2p buffers; the worst pp rank, %d, is reported below and decides whether the layout fits\n",
			l.PPSchedule, l.VirtualStages(), l.PPMicrobatchSize, l.PipelineImpl(), *r.WorstStage)
		for _, s := range r.PipelineStages {
			fmt.Fprintf(w, "  pp rank %d: stages %v, %d layers, %d micro-batch activations in flight, peak reserved %.2f GiB\n",
				s.Rank, s.Stages, s.Layers, s.InFlight, gib(s.PeakReservedBytes))
		}
	}
	segments := "expandable"
	if !r.ExpandableSegments {
		segments = "fixed"
	}
	fmt.Fprintf(w, "torch.compile: blocks %s, loss %s; eager loss type %s; allocator segments %s\n",
		onOff[r.Compile.Model], onOff[r.Compile.Loss], r.LossDType, segments)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "live at peak\tGiB\tbytes\t")
	for _, c := range memory.Categories() {
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t\n", c, gib(r.Breakdown[string(c)]), r.Breakdown[string(c)])
	}
	fmt.Fprintf(tw, "allocator_overhead\t%.2f\t%d\t\n", gib(r.Breakdown["allocator_overhead"]), r.Breakdown["allocator_overhead"])
	fmt.Fprintf(tw, "peak allocated\t%.2f\t%d\t\n", gib(r.PeakAllocatedBytes), r.PeakAllocatedBytes)
	fmt.Fprintf(tw, "peak reserved\t%.2f\t%d\t\n", gib(r.PeakReservedBytes), r.PeakReservedBytes)
	fmt.Fprintf(tw, "device\t%.2f\t%d\t\n", gib(r.DeviceBytes), r.DeviceBytes)
	tw.Flush()
	fmt.Fprintf(w, "memory fraction %.1f%% (peak reserved / device; 90%% interval %.1f%%–%.1f%%, uncalibrated: the published runs' errors): %s\n",
		100*r.MemoryFraction, 100*r.MemoryFractionInterval[0], 100*r.MemoryFractionInterval[1], r.Verdict)
	fmt.Fprintf(w, "state per rank: parameters %.2f GiB, gradients %.2f GiB, optimizer %.2f GiB\n",
		gib(r.State.Params), gib(r.State.Grads), gib(r.State.Optimizer))
	fmt.Fprintf(w, "peak at: %s\n", r.PeakEvent)
	fmt.Fprint(w, "reserved by stream:")
	for _, st := range memory.Streams() {
		fmt.Fprintf(w, " %s %.2f GiB", st, gib(r.ReservedByStream[st]))
	}
	fmt.Fprintln(w)
	if r.MaxLBS != nil {
		fmt.Fprintf(w, "max lbs within %.0f%% of device memory: %d\n", 100*r.MemoryTarget, *r.MaxLBS)
	}
	fmt.Fprintf(w, "reserved = allocated + allocator model (%s)\n", r.Allocator)
}

var onOff = map[bool]string{true: "on", false: "off"}
