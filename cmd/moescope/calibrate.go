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
	runs, names, source, err := calibrateRuns(stderr, *runsPath, logs, *force)
	if err != nil {
		return err
	}
	cal, err := calib.Calibrate(runs)
	if err != nil {
		return err
	}
	cal.Source, cal.ResidualRuns = source, names
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
	fmt.Fprintf(stderr, "wrote %s (calibration of %d runs)\n", *out, len(runs))
	if *jsonOut {
		_, err := stdout.Write(doc)
		return err
	}
	if err := paramTable(stdout, cal); err != nil {
		return err
	}
	for _, n := range cal.Notes {
		fmt.Fprintln(stdout, n)
	}
	return residualTable(stdout, cal, runs)
}

// sdHeader names the spread column: the fit's covariance is of ln θ, whose
// standard deviation is, for a small spread, θ's relative one.
const sdHeader = "rel. sd (√var ln θ)"

// paramTable prints each parameter's fitted value and spread, then those
// kept at their defaults.
func paramTable(w io.Writer, cal *cost.Calibration) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "parameter\tvalue\t%s\tstatus\n", sdHeader)
	for _, n := range cal.Fitted {
		v, err := cal.Value(n)
		if err != nil {
			return fmt.Errorf("calibrate: fitted %w", err)
		}
		fmt.Fprintf(tw, "%s\t%.4g\t%s\tfitted\n", n, v, sdText(cal, n))
	}
	for _, n := range cal.Kept {
		fmt.Fprintf(tw, "%s\t-\t—\tkept default (not identifiable from these runs)\n", n)
	}
	return tw.Flush()
}

// sdText is parameter n's relative standard deviation as a percentage, or
// "—" when the fit has none (a parameter kept at its default, or an
// allocator overhead fitted from one run).
func sdText(cal *cost.Calibration, n string) string {
	sd, ok := cal.LogSD(n)
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", 100*sd)
}

// residualTable prints each run's TPS and peak-reserved residual after
// the fit, the run named as cal.ResidualRuns names it.
func residualTable(w io.Writer, cal *cost.Calibration, runs []published.Run) error {
	fmt.Fprintln(w, "\nresiduals (predicted / measured − 1):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tmodel\tgpu\tgpus\tTPS\tpeak reserved")
	for i, r := range runs {
		mem := "-"
		if m := cal.MemoryResiduals[i]; m != nil && !math.IsNaN(*m) {
			mem = fmt.Sprintf("%+.1f%%", 100**m)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%+.1f%%\t%s\n", cal.ResidualRuns[i], r.Model, r.GPU, r.GPUs, 100*cal.Residuals[i], mem)
	}
	return tw.Flush()
}

// calibrateRuns reads the runs to fit: the runs file, or the torchtitan
// logs (then written to --runs-out when given, and their notes printed to
// stderr).
// names name each run for its residual (runNames, or the log file it was
// read from); source describes them for the calibration.
func calibrateRuns(stderr io.Writer, runsPath string, logs *logFlags, force bool) (runs []published.Run, names []string, source string, err error) {
	if runsPath == "" {
		runs, notes, err := logs.runs()
		if err != nil {
			return nil, nil, "", err
		}
		for _, n := range notes {
			fmt.Fprintln(stderr, "moescope calibrate: "+n)
		}
		if err := logs.writeRuns(stderr, runs, force); err != nil {
			return nil, nil, "", err
		}
		// titanlog reads one run per log, in the flags' order.
		if len(runs) != len(logs.logs) {
			return nil, nil, "", fmt.Errorf("calibrate: %d run(s) read from %d log(s): want one per log", len(runs), len(logs.logs))
		}
		source := fmt.Sprintf("moescope calibrate --torchtitan-log %s (%d run(s))", strings.Join(logs.logs, " "), len(runs))
		if logs.runsOut != "" {
			source = fmt.Sprintf("moescope calibrate --torchtitan-log %s (%d run(s); runs in %s)", strings.Join(logs.logs, " "), len(runs), logs.runsOut)
		}
		return runs, append([]string(nil), logs.logs...), source, nil
	}
	if runs, err = published.ReadFile(runsPath, false); err != nil {
		return nil, nil, "", err
	}
	return runs, runNames(runs, runsPath), fmt.Sprintf("moescope calibrate --runs %s (%d run(s))", runsPath, len(runs)), nil
}

// runNames names each run of the runs file path: its run_id when it has
// one (the shared validation table's name for it), else the file and its
// position in the file's array, counted from 0 as ReadRuns's errors count.
func runNames(runs []published.Run, path string) []string {
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.RunID
		if names[i] == "" {
			names[i] = fmt.Sprintf("%s[%d]", path, i)
		}
	}
	return names
}
