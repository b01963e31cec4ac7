package main

import (
	"fmt"
	"io"
	"math"
	"reflect"

	"github.com/moescope/moescope/memory/host"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
)

func init() {
	register(command{"grad", "loss and gradients of a checkpoint on token sequences (HF's training loss)", runGrad})
}

func runGrad(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("grad", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (required)")
	weights := fs.String("weights", "", "safetensors checkpoint: a file, a model.safetensors.index.json or a directory holding one")
	tokensPath := fs.String("tokens", "", "JSON array of equal-length token-id sequences; labels are the next tokens")
	acFlag := addACFlag(fs, "selective", "gradients do not depend on it")
	out := fs.String("out", "", "write the gradient of every weight here (safetensors, F32, the checkpoint's names)")
	initSeed := fs.Int64("init", -1, "use a deterministic random initialization from this seed (≥ 0) instead of --weights")
	save := fs.String("save", "", "with --init: write the initialized weights here (safetensors, F32)")
	force := fs.Bool("force", false, "overwrite existing output files")
	hostGiB := fs.Float64("host-memory-gib", defaultHostMemoryGiB, "refuse runs whose float32 tensors would need more host memory than this (or than MemAvailable, when smaller)")
	var num job.Numerics
	byKey := bindStruct(fs, reflect.ValueOf(&num).Elem())
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case (*weights == "") == (*initSeed < 0):
		return fmt.Errorf("%w: give exactly one of --weights and --init (got --weights %q, --init %d)", errUsage, *weights, *initSeed)
	case *save != "" && *initSeed < 0:
		return fmt.Errorf("%w: --save writes an --init initialization; it needs --init", errUsage)
	case *tokensPath == "" && *out != "":
		return fmt.Errorf("%w: --out needs --tokens", errUsage)
	case *tokensPath == "" && *save == "":
		return fmt.Errorf("%w: nothing to do: give --tokens (and --out) or --init with --save", errUsage)
	case !(*hostGiB > 0) || math.IsInf(*hostGiB, 0):
		return fmt.Errorf("%w: --host-memory-gib = %g: must be a finite number > 0", errUsage, *hostGiB)
	}
	limit := hostLimit{flagGiB: *hostGiB, avail: kernel.AvailableMemory()}
	ac, err := moe.ParseAC(*acFlag)
	if err != nil {
		return fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	cfg, err := loadModel(*model)
	if err != nil {
		return err
	}
	coef := ref.HFAuxCoef(cfg)
	// Refuse before computing anything: an output that exists (without
	// --force), one in a missing directory, or one path named twice.
	ins := []input{{Flag: "--model", Path: *model}, {Flag: "--weights", Path: *weights}, {Flag: "--tokens", Path: *tokensPath}}
	if err := checkIO(*force, ins, output{Flag: "--save", Path: *save}, output{Flag: "--out", Path: *out}); err != nil {
		return err
	}

	if err := checkGradMemory(cfg, limit); err != nil {
		return err
	}
	m, err := gradModel(cfg, *weights, *initSeed, *save, *force)
	if err != nil {
		return err
	}
	if *tokensPath == "" {
		return nil
	}
	tokens, err := hf.ReadTokens(*tokensPath, cfg.Vocab)
	if err != nil {
		return err
	}
	if err := checkGradActivations(cfg, len(tokens), len(tokens[0]), ac, limit); err != nil {
		return fmt.Errorf("%s: %w", *tokensPath, err)
	}
	run, cmp, err := num.Ariths(cfg.Layers)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, renameFields(err, byKey))
	}
	o := ref.Options{AC: ac, AuxCoef: coef, BF16: run.BF16, Quantize: run.Quantize}
	var base *ref.Options
	if cmp != nil {
		base = &ref.Options{AC: ac, AuxCoef: coef, BF16: cmp.BF16, Quantize: cmp.Quantize}
	}
	progress, clearBar := gradProgress(stderr)
	o.Progress = progress
	res, dev, err := m.CompareHF(tokens, base, o)
	clearBar()
	if err != nil {
		return err
	}
	if math.IsNaN(res.Total) || math.IsInf(res.Total, 0) {
		return fmt.Errorf("loss = %v, aux_loss = %v: not finite (float32 overflow in the forward pass); no gradient written", res.Loss, res.Aux)
	}
	if *out != "" {
		if err := hf.SaveParams(*out, cfg, m.Grads(), moe.F32, *force); err != nil {
			return err
		}
	}
	return writeJSONLine(stdout, "grad", gradReport{
		Loss: res.Loss, AuxLoss: res.Aux, TotalLoss: res.Total, AuxAdded: coef != 0,
		AuxCoef: coef, Sequences: len(tokens), SeqLen: len(tokens[0]), AC: ac.String(), Numerics: num, Deviation: dev,
	})
}

// gradModel is the float32 reference model of cfg with --init's weights
// (written to save when named) or those of the checkpoint weights.
func gradModel(cfg *moe.Config, weights string, initSeed int64, save string, force bool) (*ref.Model[float32], error) {
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		return nil, err
	}
	if initSeed < 0 {
		ps, err := hf.LoadFiniteParams[float32](weights, cfg)
		if err != nil {
			return nil, err
		}
		return m, m.SetTensors(ps)
	}
	m.InitRandom(uint64(initSeed))
	if save != "" {
		err = hf.SaveParams(save, cfg, m.Tensors(), moe.F32, force)
	}
	return m, err
}

// gradProgress is grad's progress bar on w when w is a terminal: the
// callback for ref.Options.Progress (nil otherwise) and what clears it.
func gradProgress(w io.Writer) (func(done, total int), func()) {
	bar := newProgressBar(w)
	if bar == nil {
		return nil, func() {}
	}
	bar.label = "grad: forward, then backward,"
	return func(done, total int) { bar.update(1, done, total) }, bar.finish
}

// gradReport is the JSON object grad prints.
type gradReport struct {
	Loss      float64 `json:"loss"`       // mean cross-entropy over the predicted positions
	AuxLoss   float64 `json:"aux_loss"`   // the model's aux loss (ref.AuxLoss) over all MoE layers; 0 when not added (HF computes it only then)
	TotalLoss float64 `json:"total_loss"` // the loss differentiated: loss + aux_coef·aux_loss when aux_added
	AuxAdded  bool    `json:"aux_added"`  // ref.HFAuxCoef ≠ 0: output_router_logits (DeepSeek-MoE: aux_loss_alpha > 0)
	AuxCoef   float64 `json:"aux_coef"`   // router_aux_loss_coef (DeepSeek-MoE: aux_loss_alpha) applied; 0 when not added
	Sequences int     `json:"sequences"`
	SeqLen    int     `json:"seq_len"`
	AC        string  `json:"ac"`
	job.Numerics
	*ref.Deviation `json:"deviation,omitempty"` // with --compare: from the compared run
}

// checkGradMemory refuses a model whose parameters alone exceed the host
// memory limit, instead of dying in the allocator: grad is a reference
// tool for small models.
func checkGradMemory(cfg *moe.Config, limit hostLimit) error {
	need, err := host.GradParamBytes(cfg)
	if err != nil {
		return err
	}
	if float64(need) > limit.bytes() {
		return fmt.Errorf("%w: %s: parameters and their gradients need about %.1f GiB in float32, over %s (grad runs the reference model on the CPU; use a smaller config)",
			errUsage, cfg.Name, float64(need)/(1<<30), limit)
	}
	return nil
}

// checkGradActivations refuses a token file whose forward and backward pass
// would not fit in the host memory limit, instead of growing until the
// kernel kills it: all sequences run as one micro-batch, and the
// activations grow with their tokens (host.GradActivationBytes).
func checkGradActivations(cfg *moe.Config, sequences, seqLen int, ac moe.AC, limit hostLimit) error {
	need, err := host.GradActivationBytes(cfg, sequences, seqLen, ac)
	if err != nil {
		return err
	}
	if need > limit.bytes() {
		return fmt.Errorf("%w: %d sequences × %d tokens need about %.1f GiB of host memory for activations in float32 (--ac %s), over %s (grad runs them as one batch on the CPU; use fewer or shorter sequences)",
			errUsage, sequences, seqLen, need/(1<<30), ac, limit)
	}
	return nil
}

// defaultHostMemoryGiB is --host-memory-gib's default in grad and train:
// the commands run the reference model on this CPU, and 16 GiB is what a
// laptop or a CI runner can spare.
const defaultHostMemoryGiB = 16

// hostLimit is the host memory a CPU command may use: --host-memory-gib,
// or MemAvailable when that is smaller (0: unknown).
type hostLimit struct {
	flagGiB float64
	avail   uint64
}

// bytes is the limit in force.
func (h hostLimit) bytes() float64 {
	b := h.flagGiB * (1 << 30)
	if h.avail > 0 && float64(h.avail) < b {
		return float64(h.avail)
	}
	return b
}

// String names the limit in force and where it comes from.
func (h hostLimit) String() string {
	if h.avail > 0 && float64(h.avail) < h.flagGiB*(1<<30) {
		return fmt.Sprintf("the %.1f GiB of memory available (MemAvailable; --host-memory-gib = %g)", float64(h.avail)/(1<<30), h.flagGiB)
	}
	return fmt.Sprintf("the limit --host-memory-gib = %g", h.flagGiB)
}
