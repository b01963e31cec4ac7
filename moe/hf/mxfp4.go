package hf

import (
	"fmt"
	"slices"

	"github.com/moescope/moescope/moe/quant"
)

// MXFP4 checkpoints (GPT-OSS's released experts): a stacked expert tensor
// W [E, C, R] (gate_up_proj [E, D, 2F], down_proj [E, F, D]) may be stored
// instead as two U8 tensors,
//
//	W_blocks [E, R, C/32, 16]   two e2m1 elements per byte, 32 per block
//	W_scales [E, R, C/32]       one e8m0 scale per block
//
// as transformers reads them (convert_moe_packed_tensors in
// integrations/mxfp4.py, transformers 0189b1d0): byte j of block g of row r
// holds element 2j of the block in its low nibble and 2j+1 in its high one,
// the block scales its 32 elements by 2^(scale − 127), and the dequantized
// [E, R, C] is transposed to [E, C, R]. The element and scale formats are
// the OCP Microscaling Formats (MX) v1.0 specification's, decoded by
// moe/quant (Format.Decode of E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; E8M0:
// 2^(s − 127), its 0xFF NaN, which is refused).

// mxfp4Suffixes name the packed tensors of a stacked tensor.
const mxfp4Blocks, mxfp4Scales = "_blocks", "_scales"

// mxfp4Shape returns the logical shape [E, C, R] of the stacked tensor
// name when the checkpoint holds it as MXFP4 blocks and scales, ok false
// when it holds neither, and an error naming the tensor when they are
// incomplete or inconsistent.
func (c *Checkpoint) mxfp4Shape(name string) (shape []int, ok bool, err error) {
	b, hasB := c.Info(name + mxfp4Blocks)
	s, hasS := c.Info(name + mxfp4Scales)
	switch {
	case !hasB && !hasS:
		return nil, false, nil
	case !hasS:
		return nil, false, fmt.Errorf("tensor %s%s has no %s%s beside it (MXFP4 needs both)", name, mxfp4Blocks, name, mxfp4Scales)
	case !hasB:
		return nil, false, fmt.Errorf("tensor %s%s has no %s%s beside it (MXFP4 needs both)", name, mxfp4Scales, name, mxfp4Blocks)
	}
	if b.DType != "U8" || s.DType != "U8" {
		return nil, false, fmt.Errorf("MXFP4 tensors %s%s and %s%s have dtypes %s and %s; both must be U8", name, mxfp4Blocks, name, mxfp4Scales, b.DType, s.DType)
	}
	if len(b.Shape) != 4 || b.Shape[3] != 16 || !slices.Equal(s.Shape, b.Shape[:3]) {
		return nil, false, fmt.Errorf("MXFP4 tensors %s%s %v and %s%s %v: need blocks [E, R, C/32, 16] and scales [E, R, C/32]", name, mxfp4Blocks, b.Shape, name, mxfp4Scales, s.Shape)
	}
	return []int{b.Shape[0], b.Shape[2] * 32, b.Shape[1]}, true, nil
}

// readMXFP4 dequantizes the stacked tensor name [E, C, R] (mxfp4Shape).
func readMXFP4[T float32 | float64](c *Checkpoint, name string, shape []int) ([]T, error) {
	blocks, err := c.ReadBytes(name + mxfp4Blocks)
	if err != nil {
		return nil, err
	}
	scales, err := c.ReadBytes(name + mxfp4Scales)
	if err != nil {
		return nil, err
	}
	E, C, R := shape[0], shape[1], shape[2]
	G := C / 32
	out := make([]T, E*C*R)
	for e := 0; e < E; e++ {
		for r := 0; r < R; r++ {
			for g := 0; g < G; g++ {
				blk := (e*R+r)*G + g
				s := quant.E8M0(scales[blk])
				if s == quant.E8M0NaN {
					return nil, fmt.Errorf("tensor %s%s[%d][%d][%d] = 0xFF: the e8m0 NaN scale (OCP MX v1.0); weights must be finite", name, mxfp4Scales, e, r, g)
				}
				for j, by := range blocks[blk*16 : blk*16+16] {
					col := g*32 + 2*j
					out[(e*C+col)*R+r] = T(quant.E2M1.Decode(uint(by&0x0F)) * s.Value())
					out[(e*C+col+1)*R+r] = T(quant.E2M1.Decode(uint(by>>4)) * s.Value())
				}
			}
		}
	}
	return out, nil
}
