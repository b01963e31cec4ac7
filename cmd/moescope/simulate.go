package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

func init() {
	register(command{"simulate", "predict step time, TPS, MFU and memory of one layout on a modelled GPU cluster", runSimulate})
}

// simulateReport is the JSON output of `moescope simulate`.
type simulateReport struct {
	Model       string     `json:"model"`
	Layout      moe.Layout `json:"layout"`
	AC          moe.AC     `json:"ac"`
	LBS         int        `json:"lbs"`
	Seq         int        `json:"seq"`
	GradAccum   int        `json:"grad_accum"`
	Calibration string     `json:"calibration,omitempty"`
	sim.Result
}

// hardwareFlags are --gpu, --cluster and --calibration, shared with calibrate.
type hardwareFlags struct{ gpu, cluster, calibration string }

func (h *hardwareFlags) load() (hw.Device, *hw.Cluster, *cost.Calibration, error) {
	dev, err := hw.LookupDevice(h.gpu)
	if err != nil {
		return dev, nil, nil, fmt.Errorf("%w: --gpu: %v", errUsage, err)
	}
	name := h.cluster
	if name == "" {
		name = hw.ClusterForGPU(dev.Name)
	}
	cl, err := hw.LoadCluster(name)
	if err != nil {
		return dev, nil, nil, fmt.Errorf("%w: --cluster: %v", errUsage, err)
	}
	var cal *cost.Calibration
	if h.calibration != "" {
		if cal, err = readCalibration(h.calibration); err != nil {
			return dev, nil, nil, err
		}
	}
	return dev, cl, cal, nil
}

// readCalibration is the one reader of --calibration for every command:
// cost.ReadCalibration bounds the read, refuses unknown fields and trailing
// data, and validates every value. Like a bad --gpu or --cluster, a bad
// file is a usage error.
func readCalibration(path string) (*cost.Calibration, error) {
	cal, err := cost.ReadCalibration(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --calibration: %v", errUsage, err)
	}
	return cal, nil
}

func runSimulate(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("simulate", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (required)")
	var hwf hardwareFlags
	fs.StringVar(&hwf.gpu, "gpu", hw.DefaultDeviceName, "device from the registry: "+strings.Join(hw.DeviceNames(), ", "))
	fs.StringVar(&hwf.cluster, "cluster", "", "built-in cluster ("+strings.Join(hw.ClusterNames(), ", ")+") or a cluster JSON path (default: the GPU's usual one)")
	fs.StringVar(&hwf.calibration, "calibration", "", "calibration JSON written by moescope calibrate (path)")
	lf := addLayoutFlags(fs)
	precision := addPrecisionFlag(fs)
	acFlag := fs.String("ac", "selective", "activation checkpointing: none|selective|full|layer:N|modules:M,… (M: layernorm, moe_act, moe)")
	mf := addMemoryModelFlags(fs)
	lbs := fs.Int("lbs", 0, "sequences per data-parallel rank per micro-step (required)")
	seq := fs.Int("seq", 0, "tokens per sequence (required)")
	accum := fs.Int("grad-accum", 1, "micro-steps per optimizer step")
	skew := fs.Float64("expert-skew", 0, "rows of the most loaded expert-parallel rank ÷ the mean (≥ 1; 0 = balanced routing)")
	tracePath := fs.String("trace", "", "write a Chrome trace (Perfetto) of one step to this file")
	traceRanks := fs.String("trace-ranks", "", "ranks in the trace: all, or a comma list (default: all up to 16 ranks, else the first host)")
	force := fs.Bool("force", false, "overwrite an existing --trace file")
	jsonOut := fs.Bool("json", false, "print one JSON object")
	target := fs.Float64("memory-target", memory.DefaultMemoryTarget, "fraction of device memory the layout may use to count as within target, in (0, 1]")
	torchFlag := fs.String("torch-version", "", "PyTorch release of the job, MAJOR.MINOR (default: 2.9 or later); before 2.9 eager RMSNorm is a composite of fp32 kernels")
	dispFlag := fs.String("dispatcher", "all_to_all", "how expert parallelism moves tokens: all_to_all (torchtitan's, a row per top-k slot), deepep or hybridep (a row per destination rank)")
	expFlag := fs.String("expert-gemm", "grouped_mm", "routed experts' matmul kernel: grouped_mm (torch._grouped_mm, torchtitan's) or cublas (TransformerEngine's GroupedLinear, one cuBLAS GEMM per expert)")
	fusedFlag := fs.Bool("fused-elementwise", false, "the framework runs each elementwise op as one fused kernel (TransformerEngine/Megatron-Core fusions) instead of PyTorch's eager decomposition")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	torchV, err := sim.ParseTorchVersion("--torch-version", *torchFlag)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	disp, err := sim.ParseDispatcher("--dispatcher", *dispFlag)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	experts, err := cost.ParseExpertGEMM("--expert-gemm", *expFlag)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := checkPrecisionFlag(*precision); err != nil {
		return err
	}
	if *model == "" {
		return fmt.Errorf("%w: --model is required (built-in: %v, or a config.json path)", errUsage, hf.Builtins())
	}
	if !(*target > 0 && *target <= 1) {
		return fmt.Errorf("%w: --memory-target = %v: must be in (0, 1]", errUsage, *target)
	}
	if *lbs < 1 {
		return fmt.Errorf("%w: --lbs = %d: must be ≥ 1", errUsage, *lbs)
	}
	if *seq < 1 {
		return fmt.Errorf("%w: --seq = %d: must be ≥ 1", errUsage, *seq)
	}
	if *accum < 1 {
		return fmt.Errorf("%w: --grad-accum = %d: must be ≥ 1", errUsage, *accum)
	}
	if *skew != 0 && !(*skew >= 1) {
		return fmt.Errorf("%w: --expert-skew = %v: must be ≥ 1 (0 = balanced)", errUsage, *skew)
	}
	if *traceRanks != "" && *tracePath == "" {
		return fmt.Errorf("%w: --trace-ranks needs --trace", errUsage)
	}
	ins := []input{{Flag: "--model", Path: *model}, {Flag: "--cluster", Path: hwf.cluster}, {Flag: "--calibration", Path: hwf.calibration}}
	if err := checkIO(*force, ins, output{Flag: "--trace", Path: *tracePath}); err != nil {
		return err
	}
	ac, err := moe.ParseAC(*acFlag)
	if err != nil {
		return fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	cfg, err := hf.Load(*model)
	if err != nil {
		return err
	}
	dev, cl, cal, err := hwf.load()
	if err != nil {
		return err
	}
	if !setFlags(fs)["gpus-per-node"] {
		lf.gpusPerNode = cl.GPUsPerNode
	}
	l, err := lf.layout(cfg)
	if err != nil {
		return err
	}
	in := sim.Input{Config: cfg, Layout: l, AC: ac, LBS: *lbs, Seq: *seq, GradAccum: *accum,
		Device: dev, Cluster: cl, Calibration: cal, ExpertSkew: *skew, KeepTimeline: *tracePath != "", MemoryTarget: *target,
		Precision: *precision, Torch: torchV, Dispatcher: disp, ExpertGEMM: experts, FusedElementwise: *fusedFlag}
	if err := mf.apply(&in.Memory); err != nil {
		return err
	}
	res, err := sim.Simulate(in)
	if err != nil {
		return err
	}
	if *tracePath != "" && l.Stages() > 1 {
		if *traceRanks != "" {
			return fmt.Errorf("%w: --trace-ranks = %s: with --pp > 1 the trace has one process per pipeline rank (one data-parallel rank of each stage)", errUsage, *traceRanks)
		}
		if err := fileio.WriteFileAtomic(*tracePath, *force, func(w io.Writer) error { return res.WriteTrace(w, nil) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "trace of %d pipeline rank(s) written to %s (open in https://ui.perfetto.dev)\n", l.PP, *tracePath)
	} else if *tracePath != "" {
		ranks, err := parseTraceRanks(*traceRanks, l.GPUs, cl.GPUsPerNode)
		if err != nil {
			return err
		}
		if err := fileio.WriteFileAtomic(*tracePath, *force, func(w io.Writer) error { return res.WriteTrace(w, ranks) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "trace of %d rank(s) written to %s (open in https://ui.perfetto.dev)\n", len(ranks), *tracePath)
	}
	rep := simulateReport{Model: cfg.Name, Layout: l, AC: ac, LBS: *lbs, Seq: *seq, GradAccum: *accum, Result: res}
	if cal != nil {
		rep.Calibration = hwf.calibration
	}
	if *jsonOut {
		return writeJSON(stdout, "simulate", rep)
	}
	return printSimulate(stdout, rep)
}

// parseTraceRanks reads --trace-ranks.
func parseTraceRanks(s string, world, perNode int) ([]int, error) {
	var out []int
	switch s {
	case "":
		n := world
		if world > 16 {
			n = min(world, perNode)
		}
		for r := range n {
			out = append(out, r)
		}
		return out, nil
	case "all":
		for r := range world {
			out = append(out, r)
		}
		return out, nil
	}
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 || r >= world {
			return nil, fmt.Errorf("%w: --trace-ranks: %q is not a rank in [0, %d)", errUsage, f, world)
		}
		out = append(out, r)
	}
	return out, nil
}

func printSimulate(w io.Writer, r simulateReport) error {
	if line := r.Fit.Line(); line != "" {
		fmt.Fprintln(w, line)
	}
	l := r.Layout
	pp := ""
	if l.Stages() > 1 {
		pp = fmt.Sprintf("pp %d × ", l.PP)
	}
	sharding := string(l.Sharding)
	if l.FSDPImpl == moe.FSDPMegatron {
		sharding += " (Megatron's FSDP schedule)"
	}
	fmt.Fprintf(w, "%s on %d × %s (%s): %sdp_replicate %d × dp_shard %d, ep %d, %s, ac %s, lbs %d, seq %d, grad-accum %d\n",
		r.Model, l.GPUs, r.Device, r.Cluster, pp, l.DPReplicate, l.DPShard, l.EP, sharding, r.AC, r.LBS, r.Seq, r.GradAccum)
	if tp := l.TPDegree(); tp > 1 {
		async := ""
		if l.AsyncTP {
			async = ", async (first of tp chunks exposed, the rest overlapped)"
		}
		fmt.Fprintf(w, "tp %d, etp %d, sequence parallel%s: tp collectives on %s\n", tp, l.ETP, async, r.TPLink)
	}
	if r.Calibration != "" {
		fmt.Fprintf(w, "calibration: %s\n", r.Calibration)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "step time\t%.4f s\t\n", r.StepTimeS)
	if iv := r.TPSInterval; iv != nil {
		// The interval is asymmetric in TPS (symmetric in ln TPS); ± is
		// its larger half-width.
		pm := 100 * math.Max(iv[1]/r.TPS-1, 1-iv[0]/r.TPS)
		fmt.Fprintf(tw, "TPS (tokens/s per GPU)\t%.0f ± %.1f%%\t\n", r.TPS, pm)
		fmt.Fprintf(tw, "TPS 90%% interval (calibration's fit)\t%.0f–%.0f\t\n", iv[0], iv[1])
	} else {
		fmt.Fprintf(tw, "TPS (tokens/s per GPU)\t%.0f\t\n", r.TPS)
	}
	fmt.Fprintf(tw, "MFU (torchtitan)\t%.1f%%\t\n", 100*r.MFU)
	convs := make([]string, 0, len(r.MFUByConvention))
	for c := range r.MFUByConvention {
		convs = append(convs, c)
	}
	sort.Strings(convs)
	for _, c := range convs {
		if c != "torchtitan" {
			fmt.Fprintf(tw, "MFU (%s)\t%.1f%%\t\n", c, 100*r.MFUByConvention[c])
		}
	}
	fmt.Fprintf(tw, "HFU (hardware, recompute included)\t%.1f%%\t\n", 100*r.HFU)
	fmt.Fprintf(tw, "peak reserved\t%.2f GiB\t\n", float64(r.PeakReservedBytes)/hw.GiB)
	fmt.Fprintf(tw, "memory fraction\t%.1f%%\t\n", 100*r.MemoryFraction)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nstep breakdown (critical path of the slowest rank):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	b := r.Breakdown
	row := func(name string, s float64) {
		fmt.Fprintf(tw, "  %s\t%.4f s\t%.1f%%\t\n", name, s, 100*s/r.StepTimeS)
	}
	for _, p := range stepParts(b) {
		row(p.Name, p.Seconds)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(b.ComputeByClassS) > 0 {
		fmt.Fprintln(w, "\ncompute + recompute by op class:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, c := range cost.OpClasses() {
			if v, ok := b.ComputeByClassS[c.String()]; ok {
				row(c.String(), v)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if pl := r.Pipeline; pl != nil {
		fmt.Fprintf(w, "\npipeline: %s, %d stage(s) per rank, %d micro-batch(es) per micro-step, messages of %d B; stage boundaries on %v\n",
			pl.Schedule, pl.VirtualStages, pl.Microbatches, pl.MessageBytes, pl.P2PLink)
		for _, st := range pl.Stages {
			fmt.Fprintf(w, "  pp rank %d: stages %v, %d layers, busy %.4f s, optimizer %.4f s, done at %.4f s, idle %.1f%%\n",
				st.Rank, st.Stages, st.Layers, st.BusyS, st.OptimizerS, st.EndS, 100*st.IdleFraction)
		}
	}
	_, err := fmt.Fprintf(w, "bottleneck: %s\n%s\n", r.Bottleneck, r.Exactness)
	return err
}
