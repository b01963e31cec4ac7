package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim/cost"
)

func init() {
	register(command{"sweep", "choose the small torchtitan runs that best calibrate the simulator; write their job configs, run scripts and a manifest", runSweep})
}

// sweepJobJSON is one job in the manifest.
type sweepJobJSON struct {
	Name           string             `json:"name"`
	TOML           string             `json:"toml"`
	Python         string             `json:"python"`
	Plan           planJSON           `json:"plan"`
	PeakReserved   float64            `json:"peak_reserved_gib"`
	Sensitivity    map[string]float64 `json:"sensitivity"` // ∂ ln TPS / ∂ ln parameter
	Why            string             `json:"why"`
	Command        string             `json:"command"`
	CommandPython  string             `json:"command_python"`
	CalibrateInput string             `json:"log"` // where the command tees its log
	script         [2]plan.ScriptJob  // the job in each run script: v0.2.2 TOML, registry form
}

type sweepParamJSON struct {
	Name       string  `json:"name"`
	Std        float64 `json:"posterior_std"`
	Identified bool    `json:"identified"`
}

type sweepManifest struct {
	Model      string           `json:"model"`
	GPU        string           `json:"gpu"`
	Cluster    string           `json:"cluster"`
	TargetGPUs int              `json:"target_gpus"`
	Seq        int              `json:"seq"`
	Steps      int              `json:"steps"`
	Scripts    []string         `json:"run_scripts"` // v0.2.2 TOML, registry form
	Scale      int              `json:"smallest_scale_gpus"`
	Candidates int              `json:"candidates"`
	Noise      float64          `json:"assumed_tps_noise"`
	Jobs       []sweepJobJSON   `json:"jobs"`
	Params     []sweepParamJSON `json:"parameters"`
	Calibrate  string           `json:"calibrate_command"`
}

func runSweep(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("sweep", stderr)
	a := &planArgs{}
	fs.StringVar(&a.model, "model", "", "built-in model name or config.json path (required)")
	a.hardwareFlags.addTo(fs)
	fs.IntVar(&a.gpus, "gpus", 0, "GPUs of the job to calibrate for (required); the sweep runs at its plan's smallest scale")
	fs.IntVar(&a.seq, "seq", 0, "tokens per sequence (required)")
	target := addTargetFlag(fs)
	out := fs.String("out", "sweep", "directory to write the jobs and the manifest into (made if missing)")
	maxJobs := fs.Int("max-jobs", 6, "most jobs to pick, in [3, 32]")
	steps := fs.Int("steps", 30, "training steps each job's command runs, in [3, 100000] (logged every step)")
	fs.BoolVar(&a.force, "force", false, "replace the sweep's own files in --out (never any other file)")
	a.recipe = addRecipeFlags(fs)
	a.recipe.timed = true
	refuseRest(fs, "sweep designs the layouts and local batches of its jobs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	a.target = *target
	a.top, a.carry, a.maxLBS = 1, 8, 256
	if err := a.validate(); err != nil {
		return err
	}
	if *maxJobs < 3 || *maxJobs > 32 || *steps < 3 || *steps > 100000 {
		return fmt.Errorf("%w: --max-jobs = %d must be in [3, 32]; --steps = %d must be in [3, 100000]", errUsage, *maxJobs, *steps)
	}
	ev, err := a.evaluator()
	if err != nil {
		return err
	}
	cfg, dev, cl := ev.Run.Model, ev.Device, ev.Cluster
	req := a.request(cfg, cl)
	for _, t := range []plan.TorchtitanTarget{plan.TorchtitanTOML, plan.TorchtitanPy} {
		// Every job is written in both forms: storage types either cannot
		// write refuse the sweep before it is designed.
		x := plan.RecipeExport(ev.Run.Recipe)
		_, _, err := t.CheckPrecision(x.Precision, x.ReduceDType)
		if err = errors.Join(err, t.CheckRecipe(ev.Run.Recipe)); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	compiled, _ := ev.Run.Compiled()
	quant := plan.QuantOf(ev.Run.Recipe)
	req.Admit = plan.StackAdmit(ev.Run, func(p plan.Point) error {
		return errors.Join(plan.TorchtitanAdmit(plan.TorchtitanTOML, p, compiled), plan.TorchtitanAdmit(plan.TorchtitanPy, p, compiled),
			plan.TorchtitanTOML.AdmitQuant(quant, p, compiled), plan.TorchtitanPy.AdmitQuant(quant, p, compiled))
	})
	d, err := plan.DesignSweep(req, ev, *maxJobs)
	if err != nil {
		return err
	}
	m := sweepManifestFor(d, a, cfg.Name, dev, cl, *out, *steps)
	return writeSweep(stdout, stderr, *out, a.force, m, d, cfg.Name, ev.Run.Recipe)
}

// sweepManifestFor lays the design out as the manifest, naming each job's
// files and commands.
func sweepManifestFor(d *plan.SweepDesign, a *planArgs, model string, dev hw.Device, cl *hw.Cluster, dir string, steps int) sweepManifest {
	m := sweepManifest{Model: model, GPU: dev.Name, Cluster: cl.Name, TargetGPUs: a.gpus, Seq: a.seq, Steps: steps, Scale: d.Scale,
		Candidates: d.Candidates, Noise: cost.RunTPSNoise,
		Scripts: []string{filepath.Join(dir, plan.ScriptName(plan.TorchtitanTOML)), filepath.Join(dir, plan.ScriptName(plan.TorchtitanPy))}}
	var logs, tomls []string
	for i, j := range d.Jobs {
		l := j.Point.Layout
		name := fmt.Sprintf("job%02d-%dgpu-%s-lbs%d", i+1, l.GPUs, strings.ReplaceAll(j.Point.AC.String(), ":", ""), j.Point.LBS)
		// The registry form is a Python module: its file's stem is an identifier.
		toml, py, log := filepath.Join(dir, name+".toml"), filepath.Join(dir, strings.ReplaceAll(name, "-", "_")+".py"), filepath.Join(dir, name+".log")
		fn := fmt.Sprintf("moescope_%s_%dgpu", strings.NewReplacer("-", "_", ".", "_").Replace(model), l.GPUs)
		st := plan.ScriptJob{Name: name, Config: filepath.Base(toml), GPUs: l.GPUs, GPUsPerHost: cl.GPUsPerNode}
		sp := st
		sp.Config, sp.Func = filepath.Base(py), fn
		m.Jobs = append(m.Jobs, sweepJobJSON{Name: name, TOML: toml, Python: py, Plan: planToJSON(j.Result, a.seq, false),
			PeakReserved: j.Score.MemoryFraction * dev.MemoryGiB(), Sensitivity: j.Sensitivity, Why: j.Why,
			Command: plan.ScriptCommand(plan.TorchtitanTOML, st, steps), CommandPython: plan.ScriptCommand(plan.TorchtitanPy, sp, steps),
			CalibrateInput: log, script: [2]plan.ScriptJob{st, sp}})
		logs, tomls = append(logs, log), append(tomls, "--job-config "+toml)
	}
	for _, p := range d.Params {
		m.Params = append(m.Params, sweepParamJSON{p.Name, p.Std, p.Identified})
	}
	m.Calibrate = fmt.Sprintf("moescope calibrate --gpu %s --torchtitan-log %s %s --out %s",
		dev.Name, strings.Join(logs, " "), strings.Join(tomls, " "), filepath.Join(dir, "calibration.json"))
	return m
}

// writeSweep writes every job's two exports (complete jobs), the two run
// scripts, manifest.json and manifest.txt into dir, after checking that
// none of them exists (unless --force): a refused sweep writes nothing.
// It prints the table to stdout and names each file on stderr. r is the
// recipe the jobs were designed under: the exports write its compile
// settings and storage types.
func writeSweep(stdout, stderr io.Writer, dir string, force bool, m sweepManifest, d *plan.SweepDesign, model string, r job.Recipe) error {
	var outs []output
	for _, j := range m.Jobs {
		outs = append(outs, output{Flag: "--out", Path: j.TOML}, output{Flag: "--out", Path: j.Python})
	}
	for _, s := range m.Scripts {
		outs = append(outs, output{Flag: "--out", Path: s})
	}
	jsonPath, txtPath := filepath.Join(dir, "manifest.json"), filepath.Join(dir, "manifest.txt")
	outs = append(outs, output{Flag: "--out", Path: jsonPath}, output{Flag: "--out", Path: txtPath})
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return fmt.Errorf("--out %s: not a directory", dir)
	}
	// Made first: the checks need the directory; a refused sweep leaves
	// at most an empty one.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if err := checkOutputs(force, outs...); err != nil {
		return err
	}
	for i, j := range d.Jobs {
		header := []string{fmt.Sprintf("moescope sweep job %d of %d: %s", i+1, len(d.Jobs), m.Jobs[i].Name),
			fmt.Sprintf("modelled: %.0f TPS per GPU, memory %.1f%% of %s", j.Score.TPS, 100*j.Score.MemoryFraction, m.GPU),
			"why: " + j.Why}
		e := plan.RecipeExport(r)
		e.Model, e.Seq, e.Point, e.Header = model, m.Seq, j.Point, header
		e.Run = &plan.TorchtitanRun{Name: m.Jobs[i].Name, Steps: m.Steps}
		for _, x := range []struct {
			path  string
			write func(io.Writer) ([]string, error)
		}{{m.Jobs[i].TOML, e.TOML}, {m.Jobs[i].Python, e.Python}} {
			if err := fileio.WriteFileAtomic(x.path, force, func(w io.Writer) error { _, err := x.write(w); return err }); err != nil {
				return err
			}
		}
	}
	for k, t := range []plan.TorchtitanTarget{plan.TorchtitanTOML, plan.TorchtitanPy} {
		var jobs []plan.ScriptJob
		for _, j := range m.Jobs {
			jobs = append(jobs, j.script[k])
		}
		if err := fileio.WriteFileAtomic(m.Scripts[k], force, func(w io.Writer) error { return plan.RunScript(w, t, jobs, m.Steps) }); err != nil {
			return err
		}
	}
	doc, err := marshalJSON("sweep", m, "  ")
	if err != nil {
		return err
	}
	if err := fileio.WriteFileAtomic(jsonPath, force, func(w io.Writer) error { _, err := w.Write(doc); return err }); err != nil {
		return err
	}
	var table strings.Builder
	sweepTable(&table, m)
	if err := fileio.WriteFileAtomic(txtPath, force, func(w io.Writer) error { _, err := io.WriteString(w, table.String()); return err }); err != nil {
		return err
	}
	if _, err = io.WriteString(stdout, table.String()); err != nil {
		return err
	}
	for _, o := range outs {
		fmt.Fprintf(stderr, "wrote %s\n", o.Path)
	}
	return nil
}

// sweepTable is the manifest as text: the jobs, why each, how to run it,
// and what the sweep identifies.
func sweepTable(w io.Writer, m sweepManifest) {
	fmt.Fprintf(w, "moescope sweep: %s on %s, calibrating for %d GPUs at seq %d; smallest scale %d GPUs; %d jobs of %d candidates\n\n",
		m.Model, m.GPU, m.TargetGPUs, m.Seq, m.Scale, len(m.Jobs), m.Candidates)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "job\tGPUs\tdp_shard\tdp_rep\tep\tac\tlbs\tTPS\tmemory\tpeak GiB")
	for _, j := range m.Jobs {
		p := j.Plan
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%.0f\t%.1f%%\t%.1f\n", j.Name, p.GPUs, p.DPShard, p.DPReplicate, p.EP, p.AC, p.LBS, p.TPS,
			100*p.MemoryFraction, j.PeakReserved)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nfill each %s…> value in the job configs; then, from the root of a torchtitan %s checkout, bash %s\n"+
		"runs the one-host jobs (%s: the registry form, torchtitan main), or each run: line below with sweep set to the absolute path of %s\n",
		plan.Placeholder, plan.TorchtitanTOMLTag, m.Scripts[0], m.Scripts[1], filepath.Dir(m.Scripts[0]))
	for _, j := range m.Jobs {
		on := ""
		if h := j.Plan.GPUs / j.script[0].GPUsPerHost; h > 1 {
			on = fmt.Sprintf("on each of the %d hosts, with HEAD_HOST the first's address, keeping rank 0's log: ", h)
		}
		fmt.Fprintf(w, "\n%s: %s\n  run: %s%s\n", j.Name, j.Why, on, j.Command)
	}
	fmt.Fprintf(w, "\nparameters (posterior std of ln θ at %.1f%% TPS noise per run; identified = calibrate will fit it from these runs):\n", 100*m.Noise)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range m.Params {
		status := "not identified by these runs: calibrate keeps its default"
		if p.Identified {
			status = "identified"
		}
		fmt.Fprintf(tw, "  %s\t%.2f%%\t%s\n", p.Name, 100*p.Std, status)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nthen: %s\n", m.Calibrate)
}
