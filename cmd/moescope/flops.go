package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/hw"
)

func init() {
	register(command{"flops", "parameters and FLOPs per layer, op and convention; MFU from a measured TPS", runFlops})
}

// parseTile reads "R" (square) or "RxC".
func parseTile(s string) (flops.Tile, error) {
	rs, cs, ok := strings.Cut(strings.ToLower(s), "x")
	if !ok {
		cs = rs
	}
	r, err1 := strconv.Atoi(rs)
	c, err2 := strconv.Atoi(cs)
	t := flops.Tile{Rows: r, Cols: c}
	if err1 != nil || err2 != nil {
		return t, fmt.Errorf("--tile = %q: want ROWSxCOLS, e.g. 128x128", s)
	}
	if err := t.Validate(); err != nil {
		return t, fmt.Errorf("--tile: %v", err)
	}
	return t, nil
}

// maxTPS bounds --tps, a measured per-GPU rate: the fastest published
// training runs reach about 2e5 tokens/s per GPU (llm.c: GPT-2 124M, 10B
// tokens in 90 minutes on 8 A100s); 1e9 is 5000 times that, so that every
// MFU printed is finite and a typo (1e300) is refused.
const maxTPS = 1e9

func runFlops(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("flops", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (moescope models lists the built-ins)")
	seq := fs.Int("seq", 4096, "tokens per sequence")
	batch := fs.Int("batch", 1, "sequences per step (per-step totals only)")
	acFlag := addACFlag(fs, "selective", "the hardware convention's recompute")
	tileFlag := fs.String("tile", "128x128", "flash-attention tile ROWSxCOLS for the hardware convention")
	gpu := fs.String("gpu", hw.DefaultDeviceName, "device whose BF16 dense peak MFU divides by")
	tps := fs.Float64("tps", 0, fmt.Sprintf("measured tokens per second per GPU, in (0, %g]; prints MFU per convention and HFU", maxTPS))
	asJSON := fs.Bool("json", false, "print one JSON object")
	mtp := fs.Bool("mtp", false, "also count the multi-token-prediction modules (num_nextn_predict_layers), which Hugging Face's model ignores")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ac, err := moe.ParseAC(*acFlag)
	if err != nil {
		return fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	tile, err := parseTile(*tileFlag)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	shape := flops.Shape{Seq: *seq, Batch: *batch}
	if err := shape.Validate(); err != nil {
		return fmt.Errorf("%w: --%v", errUsage, err)
	}
	set := setFlags(fs)
	if set["gpu"] && !set["tps"] {
		return fmt.Errorf("%w: --gpu = %s: used only with --tps (the peak MFU divides by); give --tps or leave --gpu out", errUsage, *gpu)
	}
	if set["tps"] && !(*tps > 0 && *tps <= maxTPS) {
		return fmt.Errorf("%w: --tps = %v: must be in (0, %g] tokens/s per GPU", errUsage, *tps, maxTPS)
	}
	dev, err := hw.LookupDevice(*gpu)
	if err != nil {
		return fmt.Errorf("%w: --gpu: %v", errUsage, err)
	}
	cfg, err := loadModel(*model)
	if err != nil {
		return err
	}
	rep, err := report.BuildFlops(cfg, shape, ac, tile)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}
	if *mtp {
		if rep.MTP, err = buildMTP(cfg, shape, rep.FLOPsPerStep[flops.Model]); err != nil {
			return err
		}
	}
	if *tps > 0 {
		rep.GPU, rep.PeakFLOPs, rep.TPS = dev.Name, dev.BF16FLOPs, *tps
		rep.MFUByConvention = map[flops.Convention]float64{}
		for _, c := range flops.AllConventions() {
			rep.MFUByConvention[c] = flops.MFU(rep.FLOPsPerToken[c], *tps, dev.BF16FLOPs)
		}
		h := flops.HFU(rep.FLOPsPerToken[flops.Hardware], *tps, dev.BF16FLOPs)
		rep.HFU = &h
	}
	if *asJSON {
		return writeJSON(stdout, "flops", rep)
	}
	return report.WriteFlops(stdout, rep)
}
