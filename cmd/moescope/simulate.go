package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
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
	Layout      job.Layout `json:"layout"`
	AC          moe.AC     `json:"ac"`
	LBS         int        `json:"lbs"`
	Seq         int        `json:"seq"`
	GradAccum   int        `json:"grad_accum"`
	Calibration string     `json:"calibration,omitempty"`
	// Precision is the recipe and Quantize the GEMM sets it converts;
	// CalibrationNote says what a calibration fitted on another recipe
	// leaves out.
	Precision       job.Precision `json:"precision"`
	Quantize        job.Quantize  `json:"quantize,omitempty"`
	CalibrationNote string        `json:"calibration_note,omitempty"`
	sim.Result
}

// hardwareFlags are --gpu, --cluster and --calibration, shared by the
// commands that predict time.
type hardwareFlags struct{ gpu, cluster, calibration string }

func addHardwareFlags(fs *flag.FlagSet) *hardwareFlags {
	h := &hardwareFlags{}
	h.addTo(fs)
	return h
}

// addTo defines the flags on fs.
func (h *hardwareFlags) addTo(fs *flag.FlagSet) {
	fs.StringVar(&h.gpu, "gpu", hw.DefaultDeviceName, "device from the registry: "+strings.Join(hw.DeviceNames(), ", "))
	fs.StringVar(&h.cluster, "cluster", "", "built-in cluster ("+strings.Join(hw.ClusterNames(), ", ")+") or a cluster JSON path (default: the GPU's usual one)")
	fs.StringVar(&h.calibration, "calibration", "", "calibration JSON written by moescope calibrate (path)")
}

func (h *hardwareFlags) load() (hw.Device, *hw.Cluster, *cost.Calibration, error) {
	dev, cl, err := hw.Resolve(h.gpu, h.cluster)
	if err != nil {
		return dev, nil, nil, fmt.Errorf("%w: --%v", errUsage, err)
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

// simulateFlags are simulate's own flags besides the run and the hardware.
type simulateFlags struct {
	tracePath, traceRanks string
	force, jsonOut        bool
	target                *float64
}

func runSimulate(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("simulate", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (required)")
	hwf := addHardwareFlags(fs)
	rf := addRunFlags(fs)
	rf.recipe.timed = true
	var sf simulateFlags
	fs.StringVar(&sf.tracePath, "trace", "", "write a Chrome trace (Perfetto) of one step to this file")
	fs.StringVar(&sf.traceRanks, "trace-ranks", "", "ranks in the trace: all, or a comma list (default: all up to 16 ranks, else the first host)")
	fs.BoolVar(&sf.force, "force", false, "overwrite an existing --trace file")
	fs.BoolVar(&sf.jsonOut, "json", false, "print one JSON object")
	sf.target = addTargetFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *model == "" {
		return fmt.Errorf("%w: --model is required (built-in: %v, or a config.json path)", errUsage, hf.Builtins())
	}
	if err := checkTarget(*sf.target); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if sf.traceRanks != "" && sf.tracePath == "" {
		return fmt.Errorf("%w: --trace-ranks needs --trace", errUsage)
	}
	ins := []input{{Flag: "--model", Path: *model}, {Flag: "--cluster", Path: hwf.cluster}, {Flag: "--calibration", Path: hwf.calibration}}
	if err := checkIO(sf.force, ins, output{Flag: "--trace", Path: sf.tracePath}); err != nil {
		return err
	}
	cfg, err := hf.Load(*model)
	if err != nil {
		return err
	}
	dev, cl, cal, err := hwf.load()
	if err != nil {
		return err
	}
	spec, err := rf.spec(cfg, cl)
	if err != nil {
		return err
	}
	in := sim.Input{Spec: spec, Device: dev, Cluster: cl, Calibration: cal}
	in.KeepTimeline, in.MemoryTarget = sf.tracePath != "", *sf.target
	res, err := sim.Simulate(in)
	if err != nil {
		return err
	}
	if err := writeSimTrace(stderr, sf, res, spec.Layout, cl); err != nil {
		return err
	}
	rep := simulateReport{Model: cfg.Name, Layout: spec.Layout, AC: spec.AC, LBS: spec.LBS, Seq: spec.Seq, GradAccum: spec.GradAccum, Result: res}
	rep.Precision, rep.Quantize = spec.Precision, spec.Converted()
	if cal != nil {
		rep.Calibration = hwf.calibration
		rep.CalibrationNote = calibrationNote(cal, spec.Precision)
	}
	if sf.jsonOut {
		return writeJSON(stdout, "simulate", rep)
	}
	return printSimulate(stdout, rep)
}

// writeSimTrace writes --trace: one process per pipeline rank under pp,
// else the ranks --trace-ranks names.
func writeSimTrace(stderr io.Writer, sf simulateFlags, res sim.Result, l job.Layout, cl *hw.Cluster) error {
	switch {
	case sf.tracePath == "":
		return nil
	case l.Stages() > 1:
		if sf.traceRanks != "" {
			return fmt.Errorf("%w: --trace-ranks = %s: with --pp > 1 the trace has one process per pipeline rank (one data-parallel rank of each stage)", errUsage, sf.traceRanks)
		}
		if err := fileio.WriteFileAtomic(sf.tracePath, sf.force, func(w io.Writer) error { return res.WriteTrace(w, nil) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "trace of %d pipeline rank(s) written to %s (open in https://ui.perfetto.dev)\n", l.PP, sf.tracePath)
		return nil
	}
	ranks, err := parseTraceRanks(sf.traceRanks, l.GPUs, cl.GPUsPerNode)
	if err != nil {
		return err
	}
	if err := fileio.WriteFileAtomic(sf.tracePath, sf.force, func(w io.Writer) error { return res.WriteTrace(w, ranks) }); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "trace of %d rank(s) written to %s (open in https://ui.perfetto.dev)\n", len(ranks), sf.tracePath)
	return nil
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

// calibrationNote says what a calibration fitted on runs of another
// recipe than p leaves uncalibrated ("" when it covers p).
func calibrationNote(cal *cost.Calibration, p job.Precision) string {
	if !p.LowPrecision() || cal.Covers(p) {
		return ""
	}
	fitted := cal.Precision
	if fitted == "" {
		fitted = job.BF16
	}
	return fmt.Sprintf("fitted on %s runs: applied to what %s shares with them (bf16 GEMMs, attention, elementwise ops, communication); its fp8 GEMMs and casts keep the registry's rates", fitted, p)
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
	if l.FSDPImpl == job.FSDPMegatron {
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
	if r.Precision.LowPrecision() {
		fmt.Fprintf(w, "precision %s: converts %s (router and attention in bf16); MFU is against the bf16 peak, mfu_fp8_peak against the recipe's\n", r.Precision, r.Quantize)
	}
	if r.Calibration != "" {
		fmt.Fprintf(w, "calibration: %s\n", r.Calibration)
		if r.CalibrationNote != "" {
			fmt.Fprintf(w, "  %s\n", r.CalibrationNote)
		}
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
	if m := r.MFUFP8Peak; m != nil {
		fmt.Fprintf(tw, "MFU (torchtitan, against the %s peak)\t%.1f%%\t\n", r.Precision, 100**m)
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
	for _, p := range report.StepParts(b) {
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
		if q := b.OverheadS[sim.OverheadQuantize]; q > 0 {
			row("of which quantize (fp8 casts)", q)
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
