package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

func init() {
	register(command{"calibrate", "fit the simulator's efficiencies and allocator overhead to measured runs", runCalibrate})
}

func runCalibrate(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("calibrate", stderr)
	runsPath := fs.String("runs", "", "JSON array of measured runs in the published-runs schema (source optional); or --torchtitan-log")
	out := fs.String("out", "", "calibration JSON to write (required)")
	force := fs.Bool("force", false, "overwrite an existing --out (and --runs-out) file")
	jsonOut := fs.Bool("json", false, "print the calibration as JSON instead of a table")
	logs := addLogFlags(fs)
	if err := parseCalibrateFlags(fs, logs, args); err != nil {
		return err
	}
	if err := logs.check(*runsPath); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("%w: --out is required", errUsage)
	}
	ins := append([]input{{Flag: "--runs", Path: *runsPath}}, logs.inputs()...)
	if err := checkIO(*force, ins, output{Flag: "--out", Path: *out}, output{Flag: "--runs-out", Path: logs.runsOut}); err != nil {
		return err
	}
	runs, source, err := calibrateRuns(stderr, *runsPath, logs, *force)
	if err != nil {
		return err
	}
	cal, err := calib.Calibrate(runs)
	if err != nil {
		return err
	}
	cal.Source = source
	// Marshalled before the file is written: a value JSON cannot hold
	// leaves no file behind.
	doc, err := marshalJSON("calibrate", cal, "  ")
	if err != nil {
		return err
	}
	if err := fileio.WriteFileAtomic(*out, *force, func(w io.Writer) error {
		_, err := w.Write(doc)
		return err
	}); err != nil {
		return err
	}
	if *jsonOut {
		_, err := stdout.Write(doc)
		return err
	}
	fmt.Fprintf(stdout, "calibration of %d run(s) written to %s\n", len(runs), *out)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "parameter\tvalue\tstatus")
	val := map[string]float64{
		cost.CalGEMM: cal.GEMMScale, cost.CalGrouped: cal.GroupedScale, cost.CalAttention: cal.AttentionScale,
		cost.CalMemoryBound: cal.MemoryBoundScale, cost.CalNVLink: cal.NVLinkEfficiency, cost.CalNet: cal.NetEfficiency,
		cost.CalAllocator: cal.AllocatorOverhead,
	}
	for _, n := range cal.Fitted {
		fmt.Fprintf(tw, "%s\t%.4g\tfitted\n", n, val[n])
	}
	for _, n := range cal.Kept {
		fmt.Fprintf(tw, "%s\t-\tkept default (not identifiable from these runs)\n", n)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range cal.Notes {
		fmt.Fprintln(stdout, n)
	}
	fmt.Fprintln(stdout, "\nresiduals (predicted / measured − 1):")
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tmodel\tgpu\tgpus\tTPS\tpeak reserved")
	for i, r := range runs {
		mem := "-"
		if m := cal.MemoryResiduals[i]; m != nil && !math.IsNaN(*m) {
			mem = fmt.Sprintf("%+.1f%%", 100**m)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%+.1f%%\t%s\n", i, r.Model, r.GPU, r.GPUs, 100*cal.Residuals[i], mem)
	}
	return tw.Flush()
}

// calibrateRuns reads the runs to fit: the runs file, or the torchtitan
// logs (then written to --runs-out, and their notes printed to stderr).
// source describes them for the calibration.
func calibrateRuns(stderr io.Writer, runsPath string, logs *logFlags, force bool) (runs []published.Run, source string, err error) {
	if runsPath == "" {
		runs, notes, err := logs.runs()
		if err != nil {
			return nil, "", err
		}
		for _, n := range notes {
			fmt.Fprintln(stderr, "moescope calibrate: "+n)
		}
		if err := logs.writeRuns(runs, force); err != nil {
			return nil, "", err
		}
		return runs, fmt.Sprintf("moescope calibrate --torchtitan-log %s (%d run(s); runs in %s)", strings.Join(logs.logs, " "), len(runs), logs.runsOut), nil
	}
	if runs, err = published.ReadFile(runsPath, false); err != nil {
		return nil, "", err
	}
	return runs, fmt.Sprintf("moescope calibrate --runs %s (%d run(s))", runsPath, len(runs)), nil
}
