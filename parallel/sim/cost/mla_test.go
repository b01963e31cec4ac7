package cost

import (
	"testing"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestWeightShapeMLA: for every linear of the DeepSeek-V3 family's
// built-ins (latent projections, o_proj at H·v inputs), weightShape's out·in
// times the tokens is the op's forward count, so the GEMM model prices a
// T×out×in product rather than falling back to a shapeless FLOP rate.
func TestWeightShapeMLA(t *testing.T) {
	for _, name := range []string{"deepseek-v3", "kimi-k2", "deepseek-v2-lite", "moonlight-16b-a3b"} {
		c, err := hf.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		sh := flops.Shape{Seq: 16, Batch: 1}
		recs, err := flops.Ops(c, sh, moe.AC{Mode: moe.ACNone}, flops.ExactTile)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Pass != moe.Forward || r.Op.Kind() != moe.KindMatmul {
				continue
			}
			out, in, ok := weightShape(c, r.Op)
			if !ok || sh.Tokens()*out*in != r.Count {
				t.Errorf("%s layer %d %s: shape %d×%d (ok %v) × %d tokens ≠ count %d", name, r.Layer, r.Op, out, in, ok, sh.Tokens(), r.Count)
			}
		}
	}
}
