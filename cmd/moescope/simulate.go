package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

func init() {
	register(command{"simulate", "predict step time, TPS, MFU and memory of one layout on a modelled GPU cluster", runSimulate})
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
	rep := report.Simulation{Run: report.RunOf(cfg.Name, spec), Result: res}
	rep.Precision, rep.Quantize = spec.Precision, spec.Converted()
	if cal != nil {
		rep.Calibration = hwf.calibration
		rep.CalibrationNote = report.CalibrationNote(cal, spec.Precision)
	}
	if sf.jsonOut {
		return writeJSON(stdout, "simulate", rep)
	}
	return report.WriteSimulation(stdout, rep)
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
	ranks, err := sim.TraceRanks(sf.traceRanks, l.GPUs, cl.GPUsPerNode)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := fileio.WriteFileAtomic(sf.tracePath, sf.force, func(w io.Writer) error { return res.WriteTrace(w, ranks) }); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "trace of %d rank(s) written to %s (open in https://ui.perfetto.dev)\n", len(ranks), sf.tracePath)
	return nil
}
