package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/published"
	"github.com/moescope/moescope/parallel/titanlog"
)

// pathList is a flag that may be given several times.
type pathList []string

func (p *pathList) String() string { return strings.Join(*p, ",") }
func (p *pathList) Set(s string) error {
	if s == "" {
		return errors.New("empty path")
	}
	*p = append(*p, s)
	return nil
}

// logFlags are calibrate's flags for reading torchtitan's logs.
type logFlags struct {
	logs, jobs      pathList
	skip            int
	gpu, cluster    string
	runsOut         string
	skipSet, gpuSet bool
}

func addLogFlags(fs *flag.FlagSet) *logFlags {
	l := &logFlags{}
	fs.Var(&l.logs, "torchtitan-log", "torchtitan console log of one run (repeat the flag, or list more files after it; rank 0's step lines are read)")
	fs.Var(&l.jobs, "job-config", "job config of each log, in the same order (.toml v0.2.2, .py as plan --torchtitan-py writes, .json printed); "+
		"leave out for a log that printed its config (job.print_config)")
	fs.IntVar(&l.skip, "skip-steps", 1, "logged steps to drop at the start of each log (the first includes compilation), ≥ 0")
	fs.StringVar(&l.gpu, "gpu", hw.DefaultDeviceName, "device the logged runs used")
	fs.StringVar(&l.cluster, "cluster", "", "cluster the logged runs used (default: the GPU's usual one)")
	fs.StringVar(&l.runsOut, "runs-out", "", "also write the runs read from the logs to this runs file (published-runs schema), for --runs or validate")
	return l
}

// parseCalibrateFlags is parseFlags, except that the files after
// --torchtitan-log that are not flags are more logs (`--torchtitan-log
// a.log b.log`): the flag package stops at the first of them.
func parseCalibrateFlags(fs *flag.FlagSet, l *logFlags, args []string) error {
	for {
		if err := fs.Parse(args); err != nil {
			return flagError(fs, err)
		}
		if fs.NArg() == 0 {
			break
		}
		if len(l.logs) == 0 {
			return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
		}
		l.logs = append(l.logs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	set := setFlags(fs)
	l.skipSet, l.gpuSet = set["skip-steps"], set["gpu"] || set["cluster"]
	return nil
}

// check validates the log flags against the use of --runs.
func (l *logFlags) check(runsPath string) error {
	var errs []error
	switch {
	case runsPath != "" && len(l.logs) > 0:
		errs = append(errs, errors.New("--runs and --torchtitan-log: give one source of runs"))
	case runsPath == "" && len(l.logs) == 0:
		errs = append(errs, errors.New("--runs or --torchtitan-log is required"))
	case len(l.logs) == 0 && (len(l.jobs) > 0 || l.skipSet || l.gpuSet || l.runsOut != ""):
		errs = append(errs, errors.New("--job-config, --skip-steps, --gpu, --cluster and --runs-out go with --torchtitan-log"))
	}
	if len(l.logs) > 0 {
		if len(l.jobs) > 0 && len(l.jobs) != len(l.logs) {
			errs = append(errs, fmt.Errorf("--job-config given %d time(s) for %d log(s): give one per log, in the same order, or none", len(l.jobs), len(l.logs)))
		}
		if l.skip < 0 || l.skip > 1<<20 {
			errs = append(errs, fmt.Errorf("--skip-steps = %d: must be in [0, 1048576]", l.skip))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", errUsage, errors.Join(errs...))
	}
	return nil
}

// inputs are the files the log flags read.
func (l *logFlags) inputs() []input {
	var ins []input
	for _, p := range l.logs {
		ins = append(ins, input{Flag: "--torchtitan-log", Path: p})
	}
	for _, p := range l.jobs {
		ins = append(ins, input{Flag: "--job-config", Path: p})
	}
	return ins
}

// runs reads each log (with its job config) as one measured run
// (titanlog.Files); notes say what was skipped.
func (l *logFlags) runs() ([]published.Run, []string, error) {
	dev, err := hw.LookupDevice(l.gpu)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --gpu: %v", errUsage, err)
	}
	if l.cluster != "" {
		if _, err := hw.LoadCluster(l.cluster); err != nil {
			return nil, nil, fmt.Errorf("%w: --cluster: %v", errUsage, err)
		}
	}
	runs, notes, err := titanlog.Files{Logs: l.logs, Jobs: l.jobs, Device: dev, Cluster: l.cluster, Skip: l.skip}.Runs()
	if errors.Is(err, titanlog.ErrMismatch) {
		// The wrong file named beside a log: the command line's mistake.
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return runs, notes, err
}

// writeRuns writes the runs read from the logs to --runs-out, if given,
// and says so on stderr.
func (l *logFlags) writeRuns(stderr io.Writer, runs []published.Run, force bool) error {
	if l.runsOut == "" {
		return nil
	}
	doc, err := marshalJSON("calibrate", runs, "  ")
	if err != nil {
		return err
	}
	if err := fileio.WriteFileAtomic(l.runsOut, force, func(w io.Writer) error {
		_, err := w.Write(doc)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s (%d runs)\n", l.runsOut, len(runs))
	return nil
}
