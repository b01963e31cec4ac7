package job

import (
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/quant"
)

// Numerics is the arithmetic the CPU reference runs grad with: by default
// float32 throughout; Precision bf16 rounds weights and activations to
// bfloat16 (ref.Options.BF16), and a low-precision recipe also
// fake-quantises the GEMMs it converts (quant.GEMMs; the sets of Quantize,
// or DefaultQuantize). Compare names a second recipe to run on the same
// weights and tokens and measure the loss and gradient deviation from.
type Numerics struct {
	Precision Precision `json:"precision,omitempty" help:"run the reference under this recipe: {values} (bf16 rounds weights and activations; a low-precision recipe also fake-quantises the GEMMs it converts; default: float32)"`
	Quantize  Quantize  `json:"quantize,omitempty" help:"GEMMs --precision fake-quantises, comma-separated: linear, experts, output (default: the recipe's framework set)"`
	Compare   Precision `json:"compare,omitempty" help:"also run this recipe (e.g. bf16) and report the loss and gradient deviation from it"`
}

// StochasticSeed seeds the stochastic rounding of fake-quantised gradients
// (NVFP4), so that a run is reproducible.
const StochasticSeed = 42

// Arith is one run's arithmetic in the reference: BF16 rounds weights and
// activations (ref.Options.BF16), Quantize fake-quantises the converted
// GEMMs (ref.Options.Quantize; nil: none).
type Arith struct {
	BF16     bool
	Quantize *quant.GEMMs
}

// Ariths returns the arithmetic of the Precision run of a model of layers
// blocks, and of the Compare run when one is named (nil otherwise). A
// recipe outside DESIGN's list, or one the fake quantisation cannot
// express, is an error naming the field.
func (n Numerics) Ariths(layers int) (run Arith, compare *Arith, err error) {
	if run, err = arith("precision", n.Precision, n.Quantize, layers); err != nil || n.Compare == "" {
		return run, nil, err
	}
	c, err := arith("compare", n.Compare, nil, layers)
	return run, &c, err
}

func arith(field string, p Precision, q Quantize, layers int) (Arith, error) {
	switch {
	case p == "":
		return Arith{}, nil
	case !slices.Contains(Precisions, p):
		return Arith{}, moe.FieldError{Field: field, Value: string(p), Allowed: "unknown recipe (known: " + joinValues(Precisions) + ")"}
	case !p.LowPrecision():
		return Arith{BF16: true}, nil
	}
	if err := q.check(p); err != nil {
		return Arith{}, err
	}
	r, err := quant.Lookup(string(p))
	if err != nil {
		return Arith{}, moe.FieldError{Field: field, Value: string(p), Allowed: err.Error()} // names the recipe and why
	}
	if len(q) == 0 {
		q = DefaultQuantize(p)
	}
	has := func(s GEMMSet) bool { return slices.Contains(q, s) }
	return Arith{BF16: true, Quantize: quant.NewGEMMs(r, has(QuantLinear), has(QuantExperts), has(QuantOutput), layers, StochasticSeed)}, nil
}
