package kernel

// genericKernel is the plain-Go micro-kernel: a 4×4 tile with sixteen scalar
// accumulators. Go neither vectorises nor fuses multiply-add, so this path
// runs at a fraction of the vector peak; it is the fallback under the
// purego build tag and on architectures without assembly.
var genericKernel = &microKernel{
	name: "generic", mr: 4, nr: 4,
	tile: genericTile, fmaLoop: func(n int) { genericFMALoop(n) }, loopFLOP: 16,
}

func genericTile(kc int, a, b, c []float32, ldc int, accumulate bool) {
	var c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33 float32
	a = a[:kc*4]
	b = b[:kc*4]
	for p := 0; p < kc; p++ {
		ap := a[p*4 : p*4+4 : p*4+4]
		bp := b[p*4 : p*4+4 : p*4+4]
		a0, a1, a2, a3 := ap[0], ap[1], ap[2], ap[3]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	t := [4][4]float32{{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}}
	for i := range t {
		row := c[i*ldc : i*ldc+4 : i*ldc+4]
		if accumulate {
			row[0] += t[i][0]
			row[1] += t[i][1]
			row[2] += t[i][2]
			row[3] += t[i][3]
		} else {
			row[0], row[1], row[2], row[3] = t[i][0], t[i][1], t[i][2], t[i][3]
		}
	}
}

// genericFMALoop runs n iterations of eight independent scalar multiply-adds
// (16 FLOP per iteration), the compiled-Go counterpart of the assembly FMA
// loops. It is not inlined, so its result, though unused, is computed.
//
//go:noinline
func genericFMALoop(n int) float32 {
	x0, x1, x2, x3, x4, x5, x6, x7 := float32(0), float32(0), float32(0), float32(0), float32(0), float32(0), float32(0), float32(0)
	m, s := float32(0.5), float32(0.25)
	for i := 0; i < n; i++ {
		x0 = x0*m + s
		x1 = x1*m + s
		x2 = x2*m + s
		x3 = x3*m + s
		x4 = x4*m + s
		x5 = x5*m + s
		x6 = x6*m + s
		x7 = x7*m + s
	}
	return x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7
}
