package quant

// rhtSigns is the fixed sign vector of TransformerEngine's random Hadamard
// transform (get_wgrad_sign_vector, NVIDIA/TransformerEngine d0067d0d
// transformer_engine/pytorch/custom_recipes/reference_nvfp4.py): one vector
// shared by every layer, as the NVFP4 paper prescribes.
var rhtSigns = [16]float32{1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1}

// rhtMatrix is H = S·H₁₆/4: the 16-point Sylvester Hadamard matrix with row
// i multiplied by rhtSigns[i], normalised to be orthogonal (the same file's
// _build_hadamard_matrix and _apply_rht).
var rhtMatrix = func() (h [16][16]float32) {
	for i := range 16 {
		for j := range 16 {
			sign := float32(1)
			if popcount(i&j)%2 == 1 {
				sign = -1
			}
			h[i][j] = rhtSigns[i] * sign / 4
		}
	}
	return h
}()

func popcount(x int) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// rht replaces every 16 consecutive elements x of each row by x·H, or by
// x·Hᵀ (the inverse) when inverse is set. The quantised operand is rotated
// back so that it stays in the GEMM's own basis: the product of two
// operands rotated by H along the contraction axis and quantised is the
// same, since H·Hᵀ = I.
func rht(a []float32, cols int, inverse bool) {
	if cols%16 != 0 {
		panic("quant: Hadamard transform needs a contraction length divisible by 16")
	}
	var y [16]float32
	for o := 0; o < len(a); o += 16 {
		x := a[o : o+16]
		for j := range 16 {
			var s float64
			for i := range 16 {
				h := rhtMatrix[i][j]
				if inverse {
					h = rhtMatrix[j][i]
				}
				s += float64(x[i]) * float64(h)
			}
			y[j] = float32(s)
		}
		copy(x, y[:])
	}
}
