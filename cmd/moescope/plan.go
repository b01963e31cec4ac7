package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim/cost"
)

func init() {
	register(command{"plan", "search layouts, checkpointing and local batch for the most TPS within a memory target; export to torchtitan", runPlan})
}

// planEvaluator turns the real evaluator into the one the search uses;
// tests replace it to make goldens independent of the performance model.
var planEvaluator = func(sim *plan.SimEvaluator) plan.Evaluator { return sim }

type planArgs struct {
	hardwareFlags
	model                              string
	gpus, gpusPerNode, seq             int
	target                             float64
	globalBatch, top, carry, maxLBS    int
	jsonOut, exhaustive, force, knobs  bool
	searchSettings                     []string // --search-settings
	gradSyncLastOnly                   bool
	gpusPerNodeSet                     bool // --gpus-per-node given (an explicit 0 is refused)
	tomlPath, pyPath, tracePath, plotD string
	reportPath, tpList                 string
	ppList, mbsList, cpList            string
	tps, pps, mbss, cps                []int // parsed --tp, --pp, --pp-microbatch-sizes, --cp
	schedList                          string
	scheds                             []job.PPSchedule // parsed --pp-schedules
	acFlag                             string
	acs                                []moe.AC // parsed --ac (nil: the planner's default policies)
	recipe                             *recipeFlags
	precisions                         *precisionList   // --precision's list
	narrow                             *exportNarrowing // set by request when an export is asked for
}

func runPlan(stdout, stderr io.Writer, args []string) error {
	a, err := parsePlanArgs(stderr, args)
	if err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		// A search's memory timelines (tens of megabytes for a pipeline
		// rank) die as soon as their peak is read, so the collector ran
		// a fifth of the time at Go's default; collecting at 5× the live
		// heap instead of 2× takes a quarter of that, and the soft limit
		// keeps the heap under 2 GiB whatever the search.
		defer debug.SetGCPercent(debug.SetGCPercent(400))
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(2 << 30))
	}
	if err := a.checkOutputs(); err != nil {
		return err
	}
	simEv, err := a.evaluator()
	if err != nil {
		return err
	}
	cfg, dev, cl := simEv.Run.Model, simEv.Device, simEv.Cluster
	if err := plan.CheckHosts(a.gpus, cl.GPUsPerNode); err != nil {
		src := fmt.Sprintf("the cluster %s's; --gpus-per-node sets another", cl.Name)
		if a.gpusPerNodeSet {
			src = "--gpus-per-node's"
		}
		return fmt.Errorf("%w: --gpus: %v (gpus_per_node: %s)", errUsage, err, src)
	}
	req := a.request(cfg, cl)
	recipes, err := a.precisions.recipes(simEv.Run.Recipe)
	if err != nil {
		return err
	}
	choices, err := plan.SettingChoices(recipes, a.searchSettings, cfg.IsMoE())
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	say := stdout
	if a.jsonOut {
		say = stderr
	}
	narrowOf := map[*plan.SimEvaluator]*exportNarrowing{} // each recipe's search counts its own refusals
	simEv, rep, err := plan.SearchRecipes(say, choices, simEv, func(ev *plan.SimEvaluator) (*plan.Report, error) {
		if a.narrow != nil {
			if err := a.narrow.checkRecipe(ev.Run.Recipe); err != nil {
				return nil, err
			}
			// Each search refuses the points its own recipe's converters
			// cannot run (AdmitQuant).
			n := newExportNarrowing(a.tomlPath, a.pyPath, a.recipe.r.Compile)
			n.Quant = plan.QuantOf(ev.Run.Recipe)
			req.Admit, narrowOf[ev] = n.Admit, n
		}
		bar := newProgressBar(stderr)
		if bar != nil {
			req.Progress = bar.update
		}
		q := req
		q.Admit = plan.StackAdmit(ev.Run, req.Admit) // the stack settings the simulator refuses at a layout
		rep, err := plan.Search(q, planEvaluator(ev))
		bar.finish()
		return rep, err // a plan.InfeasibleError explains itself; exit status 1
	})
	if err != nil {
		return err
	}
	if err := simEv.Intervals(rep, a.top); err != nil {
		return err
	}
	if a.knobs {
		if rep.Knobs, err = simEv.KnobEffects(rep.Best, a.target); err != nil {
			return err
		}
	}
	var narrowed bytes.Buffer
	if a.narrow != nil {
		a.narrow = narrowOf[simEv]
		a.narrow.report(&narrowed, rep)
		stderr.Write(narrowed.Bytes())
	}

	title := fmt.Sprintf("%s on %d × %s (%s, %d GPUs per host), seq %d, memory target %.2f", cfg.Name, a.gpus, dev.Name, cl.Name, cl.GPUsPerNode, a.seq, a.target)
	if a.globalBatch > 0 {
		title += fmt.Sprintf(", global batch %d sequences", a.globalBatch)
	}
	if a.jsonOut {
		if err := planWriteJSON(stdout, a, cfg.Name, dev.Name, cl.Name, simEv.Run.Precision, rep); err != nil {
			return err
		}
	} else {
		planWriteTable(stdout, title, rep, a, dev)
	}
	return a.writeFiles(stderr, title, rep, cfg, dev, simEv, simEv.Calibration, narrowed.String())
}

// evaluator loads the model, hardware and calibration the flags name and
// returns the planner's evaluator over them, with the memory-model flags.
func (a *planArgs) evaluator() (*plan.SimEvaluator, error) {
	cfg, dev, cl, cal, err := a.load()
	if err != nil {
		return nil, err
	}
	rec, err := a.recipe.recipe()
	if err != nil {
		return nil, err
	}
	run := job.Spec{Model: cfg, Batch: job.Batch{Seq: a.seq, GradAccum: 1}, Recipe: rec}
	return &plan.SimEvaluator{Run: run, Device: dev, Cluster: cl, Calibration: cal}, nil
}

// parsePlanArgs reads and checks plan's flags.
func parsePlanArgs(stderr io.Writer, args []string) (*planArgs, error) {
	fs := newFlags("plan", stderr)
	a := &planArgs{}
	fs.StringVar(&a.model, "model", "", "built-in model name or config.json path (required)")
	a.hardwareFlags.addTo(fs)
	fs.IntVar(&a.gpus, "gpus", 0, "GPUs in the job, the target scale (required)")
	fs.IntVar(&a.gpusPerNode, "gpus-per-node", 0, fmt.Sprintf("GPUs per host, in [1, %d] (default from the cluster)", hw.MaxGPUsPerNode))
	fs.IntVar(&a.seq, "seq", 0, "tokens per sequence (required)")
	target := addTargetFlag(fs)
	fs.IntVar(&a.globalBatch, "global-batch", 0, "sequences per optimizer step at the target scale (0 = free: no accumulation)")
	fs.IntVar(&a.top, "top", 10, "plans shown in the table and in --json")
	fs.IntVar(&a.carry, "carry", 8, "layout families each stage carries to the next")
	fs.IntVar(&a.maxLBS, "max-lbs", 256, "largest local batch searched")
	fs.BoolVar(&a.jsonOut, "json", false, "print one JSON object instead of the table")
	fs.BoolVar(&a.knobs, "knobs", true, "say what turning each setting of the stack (compile, loss chunks, dispatcher, reshard, reduce type, precision) would change for the best plan")
	fs.Func("search-settings", "settings of the stack to search as well, comma-separated, of "+strings.Join(plan.SearchSettingNames(), ", ")+
		" (each value of each, with every --precision; the best of all is kept)", func(v string) error {
		a.searchSettings = strings.Split(v, ",")
		return nil
	})
	fs.BoolVar(&a.exhaustive, "exhaustive", false, "search the whole space at the target scale (slow; checks the hierarchical search)")
	fs.BoolVar(&a.gradSyncLastOnly, "grad-sync-last-only", false, "also search fsdp layouts that reduce gradients only on the last "+
		"accumulation micro-step (FSDP2 set_requires_gradient_sync(False) before; not exportable to torchtitan)")
	fs.StringVar(&a.tomlPath, "torchtitan-toml", "", "write the best plan as a torchtitan "+plan.TorchtitanTOMLTag+" TOML job config")
	fs.StringVar(&a.pyPath, "torchtitan-py", "", "write the best plan as a config-registry function for current torchtitan")
	fs.StringVar(&a.tracePath, "trace", "", "write a Chrome trace of the best plan's step")
	fs.StringVar(&a.plotD, "plot", "", "write PNG and SVG pictures of the search into this directory")
	fs.StringVar(&a.reportPath, "report", "", "write one self-contained HTML page: tables, plots, the best plan's breakdown and memory, the calibration")
	fs.BoolVar(&a.force, "force", false, "overwrite existing output files")
	fs.StringVar(&a.tpList, "tp", "1", "tensor-parallel degrees searched, comma-separated (e.g. 1,2,4); each within a host, etp 1 and tp tried with ep, "+
		"inside the pipeline stages too with --pp")
	fs.StringVar(&a.cpList, "cp", "", "context-parallel degrees searched, comma-separated (e.g. 1,2,4,8; default 1, and 1,2,4,8 within a host when nothing fits without cp)")
	fs.StringVar(&a.ppList, "pp", "1", "pipeline-parallel degrees searched, comma-separated (e.g. 1,2,4,8); each where torchtitan's layer split is even, "+
		"with the schedules of --pp-schedules and each degree of --tp")
	fs.StringVar(&a.schedList, "pp-schedules", "1F1B,Interleaved1F1B", fmt.Sprintf("pipeline schedules tried with --pp above 1, comma-separated, of %v "+
		"(multi-stage ones with 2 stages per rank)", job.PPSchedules()))
	fs.StringVar(&a.mbsList, "pp-microbatch-sizes", "1,2", "sequences per pipeline micro-batch tried with --pp above 1, comma-separated")
	fs.StringVar(&a.acFlag, "ac", "", "search only this activation-checkpointing policy: "+acPolicies+", or memory_budget for F = 0.25, 0.5, 0.75 (default: none, selective and full)")
	a.recipe = addRecipeFlags(fs)
	a.recipe.timed = true
	a.precisions = addPrecisionList(a.recipe)
	mtp := addMTPFlag(fs)
	refuseRest(fs, "plan searches the layout and the local batch (--gpus, --tp, --pp, --pp-schedules, --pp-microbatch-sizes, --ac, --max-lbs, --global-batch bound it)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	a.target = *target
	if err := mtp(); err != nil {
		return nil, err
	}
	a.gpusPerNodeSet = setFlags(fs)["gpus-per-node"]
	if _, err := a.recipe.recipe(); err != nil {
		return nil, err
	}
	return a, a.validate()
}

// validate reports every out-of-range flag at once, as a usage error.
func (a *planArgs) validate() error {
	var errs []error
	if a.model == "" {
		errs = append(errs, fmt.Errorf("--model is required (built-in: %s, or a config.json path)", strings.Join(hf.Builtins(), ", ")))
	}
	if a.gpus < 1 || a.gpus > 1<<20 {
		errs = append(errs, fmt.Errorf("--gpus = %d: must be in [1, 1048576]", a.gpus))
	}
	if a.seq < 1 || a.seq > job.MaxSeq {
		errs = append(errs, fmt.Errorf("--seq = %d: must be in [1, %d]", a.seq, job.MaxSeq))
	}
	if err := checkTarget(a.target); err != nil {
		errs = append(errs, err)
	}
	// Commands reusing the plan flags without these (sweep) leave them
	// empty: degree 1, the default sizes.
	a.tps = intList(&errs, "--tp", a.tpList, job.MaxDegree)
	a.pps = intList(&errs, "--pp", a.ppList, job.MaxDegree)
	a.cps = intList(&errs, "--cp", a.cpList, job.MaxDegree)
	a.mbss = intList(&errs, "--pp-microbatch-sizes", a.mbsList, max(a.maxLBS, 1))
	for f := range strings.SplitSeq(a.schedList, ",") {
		if a.schedList == "" {
			break // sweep: no --pp-schedules, the planner's default
		}
		s := job.PPSchedule(strings.TrimSpace(f))
		if err := s.Check(); err != nil {
			errs = append(errs, fmt.Errorf("--pp-schedules = %q: %w", a.schedList, err))
			continue
		}
		if slices.Contains(a.scheds, s) {
			errs = append(errs, fmt.Errorf("--pp-schedules = %q: %s named twice", a.schedList, s))
			continue
		}
		a.scheds = append(a.scheds, s)
	}
	if acs, err := plan.ParseACs(a.acFlag); a.acFlag != "" && err != nil {
		errs = append(errs, fmt.Errorf("--ac: %v", err))
	} else if a.acFlag != "" {
		a.acs = acs
	}
	if a.globalBatch < 0 || a.globalBatch > 1<<40 {
		errs = append(errs, fmt.Errorf("--global-batch = %d: must be in [1, 1099511627776] sequences (0 = free)", a.globalBatch))
	}
	if a.top < 1 {
		errs = append(errs, fmt.Errorf("--top = %d: must be ≥ 1", a.top))
	}
	if a.carry < 1 {
		errs = append(errs, fmt.Errorf("--carry = %d: must be ≥ 1", a.carry))
	}
	if a.maxLBS < 1 || a.maxLBS > 1<<16 {
		errs = append(errs, fmt.Errorf("--max-lbs = %d: must be in [1, 65536]", a.maxLBS))
	}
	if a.gpusPerNode < 0 || a.gpusPerNode > hw.MaxGPUsPerNode || (a.gpusPerNodeSet && a.gpusPerNode == 0) {
		errs = append(errs, fmt.Errorf("--gpus-per-node = %d: must be in [1, %d] (leave it out for the cluster's)", a.gpusPerNode, hw.MaxGPUsPerNode))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", errUsage, errors.Join(errs...))
	}
	return nil
}

// intList parses a comma-separated list of integers in [1, hi] given as
// flag (nil when empty), adding an error naming the flag for a bad entry.
func intList(errs *[]error, flag, list string, hi int) []int {
	if list == "" {
		return nil
	}
	var out []int
	for _, f := range strings.Split(list, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 || v > hi {
			*errs = append(*errs, fmt.Errorf("%s = %q: %q must be an integer in [1, %d]", flag, list, f, hi))
			continue
		}
		out = append(out, v)
	}
	return out
}

// checkOutputs refuses, before searching, every output that could not be
// written once the search is over.
func (a *planArgs) checkOutputs() error {
	ins := []input{{Flag: "--model", Path: a.model}, {Flag: "--cluster", Path: a.cluster}, {Flag: "--calibration", Path: a.calibration}}
	if err := checkIO(a.force, ins, output{Flag: "--torchtitan-toml", Path: a.tomlPath}, output{Flag: "--torchtitan-py", Path: a.pyPath}, output{Flag: "--trace", Path: a.tracePath}, output{Flag: "--report", Path: a.reportPath}); err != nil {
		return err
	}
	if a.plotD != "" {
		return report.CheckPlots(a.plotD, a.force)
	}
	return nil
}

// load resolves the model, device, cluster and calibration the flags name
// (the hardware as simulate resolves it, then --gpus-per-node).
func (a *planArgs) load() (cfg *moe.Config, dev hw.Device, cl *hw.Cluster, cal *cost.Calibration, err error) {
	if cfg, err = hf.Load(a.model); err != nil {
		return nil, dev, nil, nil, fmt.Errorf("%w: --model: %v", errUsage, err)
	}
	if dev, cl, cal, err = a.hardwareFlags.load(); err != nil {
		return nil, dev, nil, nil, err
	}
	if a.gpusPerNode > 0 {
		c := cl.WithGPUsPerNode(a.gpusPerNode)
		cl = &c
	}
	return cfg, dev, cl, cal, nil
}

// request is the search the flags ask for; an export narrows it to the
// points torchtitan can run.
func (a *planArgs) request(cfg *moe.Config, cl *hw.Cluster) plan.Request {
	req := plan.Request{GPUs: a.gpus, GPUsPerNode: cl.GPUsPerNode, Experts: 0, MemoryTarget: a.target,
		GlobalBatch: a.globalBatch, MaxLBS: a.maxLBS, Carry: a.carry, Exhaustive: a.exhaustive, GradSyncLastOnly: a.gradSyncLastOnly, TPs: a.tps, CPs: a.cps,
		PPs: a.pps, PPMicrobatchSizes: a.mbss, PPSchedules: a.scheds, Layers: cfg.Layers, ACs: a.acs}
	if cfg.IsMoE() {
		req.Experts = cfg.Experts
	}
	if a.narrow = newExportNarrowing(a.tomlPath, a.pyPath, a.recipe.r.Compile); a.narrow != nil {
		req.Admit = a.narrow.Admit
	}
	req.Admit = plan.TPAdmit(cfg, a.seq, req.Admit) // tp and cp degrees the model and the sequence split
	return req
}

// writeFiles writes the exports, the trace and the plots the flags ask for.
func (a *planArgs) writeFiles(stderr io.Writer, title string, rep *plan.Report, cfg *moe.Config, dev hw.Device, simEv *plan.SimEvaluator,
	cal *cost.Calibration, narrowed string) error {
	allocNote := "memory assumed fixed allocator segments (no expandable_segments)"
	if simEv.Run.ExpandableSegments {
		allocNote = "memory assumed PYTORCH_ALLOC_CONF=expandable_segments:True, which torchtitan's run_train.sh sets"
	}
	header := []string{"moescope plan: " + title,
		fmt.Sprintf("modelled: %.0f TPS per GPU, MFU %.1f%% (torchtitan convention), memory %.1f%% of %s, step %.3f s",
			rep.Best.Score.TPS, 100*rep.Best.Score.MFU, 100*rep.Best.Score.MemoryFraction, dev.Name, rep.Best.Score.StepTimeS),
		allocNote}
	if iv := rep.Best.Score.TPSInterval; iv != nil {
		header = append(header, fmt.Sprintf("TPS 90%% interval %.0f–%.0f (%s)", iv[0], iv[1], intervalSource(rep)))
	}
	export := plan.RecipeExport(simEv.Run.Recipe)
	export.Model, export.Seq, export.Point, export.Header, export.Layers = cfg.Name, a.seq, rep.Best.Point, header, cfg.Layers
	for _, x := range []struct {
		path, what string
		write      func(io.Writer) ([]string, error)
	}{{a.tomlPath, plan.TorchtitanTOML.String(), export.TOML}, {a.pyPath, plan.TorchtitanPy.String(), export.Python}} {
		if x.path == "" {
			continue
		}
		var skipped []string
		err := fileio.WriteFileAtomic(x.path, a.force, func(w io.Writer) error {
			var err error
			skipped, err = x.write(w)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s (%s)\n", x.path, x.what)
		if len(skipped) > 0 {
			fmt.Fprintf(stderr, "moescope plan: %s: not exported: %s (see the comment in the file)\n", x.path, strings.Join(skipped, ", "))
		}
	}
	if a.tracePath != "" {
		if err := fileio.WriteFileAtomic(a.tracePath, a.force, func(w io.Writer) error {
			return simEv.Trace(w, rep.Best.Point)
		}); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s (Chrome trace of the best plan's step; open in https://ui.perfetto.dev)\n", a.tracePath)
	}
	var notes []string
	if narrowed != "" {
		notes = append(notes, strings.TrimPrefix(strings.TrimSpace(narrowed), "moescope plan: "))
	}
	return a.writePictures(stderr, title, rep, cfg, dev, simEv, cal, append(notes, allocNote+"."))
}

// writePictures writes the plots and the HTML report the flags ask for;
// notes are the report's remarks on what the search assumed.
func (a *planArgs) writePictures(stderr io.Writer, title string, rep *plan.Report, cfg *moe.Config, dev hw.Device, simEv *plan.SimEvaluator,
	cal *cost.Calibration, notes []string) error {
	if a.plotD == "" && a.reportPath == "" {
		return nil
	}
	d, err := a.plotData(rep, cfg, dev, simEv)
	if err != nil {
		return err
	}
	if a.plotD != "" {
		if err := report.WritePlots(stderr, a.plotD, a.force, d); err != nil {
			return err
		}
	}
	if a.reportPath == "" {
		return nil
	}
	if err := fileio.WriteFileAtomic(a.reportPath, a.force, func(w io.Writer) error {
		return writePlanReport(w, title, a, rep, d, dev, cal, notes)
	}); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s (HTML report)\n", a.reportPath)
	return nil
}

// plotData gathers what the pictures show beyond the search: local-batch
// sweeps at the target scale (through the same evaluator as the search)
// and the best plan's memory timeline (the memory model's, whatever the
// evaluator).
func (a *planArgs) plotData(rep *plan.Report, cfg *moe.Config, dev hw.Device, simEv *plan.SimEvaluator) (*report.Data, error) {
	sweeps, err := report.TargetSweeps(planEvaluator(simEv), rep, a.target, a.maxLBS, a.globalBatch, a.acs)
	if err != nil {
		return nil, err
	}
	mem, err := simEv.MemoryReport(rep.Best.Point)
	if err != nil {
		return nil, err
	}
	return &report.Data{Search: rep, Model: cfg.Name, GPU: dev.Name, DeviceGiB: dev.MemoryGiB(), Target: a.target, Sweeps: sweeps, Memory: mem}, nil
}
