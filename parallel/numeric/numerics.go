package numeric

import (
	"fmt"

	"github.com/moescope/moescope/moe/ref"
)

// checkNumerics refuses a Numerics the ranks cannot run: an unknown or
// inexpressible recipe (job.Numerics.Ariths), or fake quantisation on a
// layout whose GEMMs run outside the reference's own linears (expert
// parallelism's stage, tensor parallelism's sharded linears, pipeline
// stages), named.
func (s Spec) checkNumerics() error {
	run, _, err := s.Numerics.Ariths(s.Model.Layers)
	if err != nil {
		return fmt.Errorf("numeric: %w", err)
	}
	if l := s.Mesh.Layout; run.Quantize != nil && (l.EP > 1 || l.TPDegree() > 1 || l.Stages() > 1) {
		return fmt.Errorf("numeric: precision = %s: fake quantisation runs in one rank's whole reference model; ep %d, tp %d, pp %d are not quantised yet (ep, tp and pp must be 1)",
			s.Numerics.Precision, l.EP, l.TPDegree(), l.Stages())
	}
	return nil
}

// withNumerics is o under the spec's arithmetic, with the rank's own
// fake quantisation (its own stochastic-rounding generator).
func (s Spec) withNumerics(o ref.Options) ref.Options {
	run, _, _ := s.Numerics.Ariths(s.Model.Layers) // checked by New
	o.BF16, o.Quantize = run.BF16, run.Quantize
	return o
}
