package report

import (
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Run is the run a command reports on: its model, layout, checkpointing
// and batch, the first keys of simulate's and train's JSON.
type Run struct {
	Model     string     `json:"model"`
	Layout    job.Layout `json:"layout"`
	AC        moe.AC     `json:"ac"`
	LBS       int        `json:"lbs"`
	Seq       int        `json:"seq"`
	GradAccum int        `json:"grad_accum"`
}

// RunOf is run s of the model named model.
func RunOf(model string, s job.Spec) Run {
	return Run{Model: model, Layout: s.Layout, AC: s.AC, LBS: s.LBS, Seq: s.Seq, GradAccum: s.GradAccum}
}

// Simulation is the JSON output of `moescope simulate`.
type Simulation struct {
	Run
	Calibration string `json:"calibration,omitempty"`
	// Precision is the recipe and Quantize the GEMM sets it converts;
	// CalibrationNote says what a calibration fitted on another recipe
	// leaves out.
	Precision       job.Precision `json:"precision"`
	Quantize        job.Quantize  `json:"quantize,omitempty"`
	CalibrationNote string        `json:"calibration_note,omitempty"`
	sim.Result
}

// CalibrationNote says what a calibration fitted on runs of another
// recipe than p leaves uncalibrated ("" when it covers p).
func CalibrationNote(cal *cost.Calibration, p job.Precision) string {
	if !p.LowPrecision() || cal.Covers(p) {
		return ""
	}
	fitted := cal.Precision
	if fitted == "" {
		fitted = job.BF16
	}
	return fmt.Sprintf("fitted on %s runs: applied to what %s shares with them (bf16 GEMMs, attention, elementwise ops, communication); its fp8 GEMMs and casts keep the registry's rates", fitted, p)
}

// WriteSimulation prints r as simulate's text output.
func WriteSimulation(w io.Writer, r Simulation) error {
	writeSimHeader(w, r)
	if err := writeSimFigures(w, r); err != nil {
		return err
	}
	return writeSimBreakdown(w, r)
}

// writeSimHeader prints the verdict line, the run and its recipe.
func writeSimHeader(w io.Writer, r Simulation) {
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
	if cp := l.CPDegree(); cp > 1 {
		fmt.Fprintf(w, "cp %d (%s, load balancer %s): dp_shard %d × cp %d shard the weights; each sequence split over the cp ranks, K/V exchanged on %s\n",
			cp, l.CPMethod, l.CPLoadBalancer, l.DPShard, cp, r.CPLink)
	}
	if r.Precision.LowPrecision() {
		key := "mfu_fp8_peak"
		if r.Precision.FP4() {
			key = "mfu_fp4_peak"
		}
		fmt.Fprintf(w, "precision %s: converts %s (router and attention in bf16); MFU is against the bf16 peak, %s against the recipe's\n", r.Precision, r.Quantize, key)
	}
	if r.Calibration != "" {
		fmt.Fprintf(w, "calibration: %s\n", r.Calibration)
		if r.CalibrationNote != "" {
			fmt.Fprintf(w, "  %s\n", r.CalibrationNote)
		}
	}
}

// writeSimFigures prints step time, TPS, MFU and memory with their intervals.
func writeSimFigures(w io.Writer, r Simulation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "step time\t%.4f s\t\n", r.StepTimeS)
	if iv := r.TPSInterval; iv != nil {
		// The interval is asymmetric in TPS (symmetric in ln TPS); ± is
		// its larger half-width.
		pm := 100 * math.Max(iv[1]/r.TPS-1, 1-iv[0]/r.TPS)
		un := ""
		if r.IntervalFrom != sim.IntervalCalibration {
			un = " uncalibrated"
		}
		fmt.Fprintf(tw, "TPS (tokens/s per GPU)\t%.0f ± %.1f%%%s\t\n", r.TPS, pm, un)
		fmt.Fprintf(tw, "TPS 90%% interval (%s)\t%.0f–%.0f\t\n", r.IntervalFrom, iv[0], iv[1])
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
	for _, m := range []*float64{r.MFUFP8Peak, r.MFUFP4Peak} {
		if m != nil {
			fmt.Fprintf(tw, "MFU (torchtitan, against the %s peak)\t%.1f%%\t\n", r.Precision, 100**m)
		}
	}
	fmt.Fprintf(tw, "HFU (hardware, recompute included)\t%.1f%%\t\n", 100*r.HFU)
	fmt.Fprintf(tw, "peak reserved\t%.2f GiB\t\n", float64(r.PeakReservedBytes)/hw.GiB)
	fmt.Fprintf(tw, "memory fraction\t%.1f%% (90%%: %.1f%%–%.1f%%), %s\t\n", 100*r.MemoryFraction,
		100*r.MemoryFractionInterval[0], 100*r.MemoryFractionInterval[1], r.Verdict)
	if err := tw.Flush(); err != nil {
		return err
	}
	return nil
}

// writeSimBreakdown prints the critical path, the op classes and the pipeline.
func writeSimBreakdown(w io.Writer, r Simulation) error {
	fmt.Fprintln(w, "\nstep breakdown (critical path of the slowest rank):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	b := r.Breakdown
	row := func(name string, s float64) {
		fmt.Fprintf(tw, "  %s\t%.4f s\t%.1f%%\t\n", name, s, 100*s/r.StepTimeS)
	}
	for _, p := range StepParts(b) {
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
