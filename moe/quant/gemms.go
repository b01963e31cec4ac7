package quant

import (
	"math/rand/v2"
	"sync"
)

// GEMMs is what a run fake-quantises: a recipe over the GEMM sets it
// converts (Linear: attention projections, dense and shared-expert FFNs;
// Experts: the routed experts' grouped GEMMs; Output: the output head, as
// moe/job's GEMM sets) in a model of Layers blocks, the recipe's
// BF16LastLayers last ones excepted. The reference (moe/ref) maps its ops
// to these sets.
type GEMMs struct {
	Recipe                  Recipe
	Linear, Experts, Output bool
	Layers                  int

	mu  sync.Mutex // guards rng: blocks may run on several goroutines
	rng *rand.Rand
}

// NewGEMMs returns r over the given sets of a model of layers blocks;
// stochastic rounding draws from a generator seeded with seed.
func NewGEMMs(r Recipe, linear, experts, output bool, layers int, seed uint64) *GEMMs {
	return &GEMMs{Recipe: r, Linear: linear, Experts: experts, Output: output, Layers: layers, rng: NewRand(seed)}
}

// HighPrecisionLayer says block layer stays in high precision (one of the
// recipe's BF16LastLayers).
func (g *GEMMs) HighPrecisionLayer(layer int) bool {
	return layer < g.Layers && layer >= g.Layers-g.Recipe.BF16LastLayers
}

// Apply is s.Apply under g's generator, safe for concurrent use.
func (g *GEMMs) Apply(s Scaling, dst, src []float32, rows, cols int, axis Axis) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s.Apply(dst, src, rows, cols, axis, g.rng)
}
