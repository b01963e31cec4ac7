package kernel

import (
	"math"
	"math/rand/v2"
	"testing"
)

// normInputs returns rows×n inputs: x with rows of different scales (so r
// differs per row), w around 1 and dy standard normal.
func normInputs(r *rand.Rand, rows, n int) (x, w, dy []float32) {
	x, w, dy = make([]float32, rows*n), make([]float32, n), make([]float32, rows*n)
	for i := 0; i < rows; i++ {
		s := math.Exp(r.NormFloat64())
		for j := 0; j < n; j++ {
			x[i*n+j] = float32(r.NormFloat64() * s)
			dy[i*n+j] = float32(r.NormFloat64())
		}
	}
	for j := range w {
		w[j] = float32(1 + 0.3*r.NormFloat64())
	}
	return x, w, dy
}

// TestRMSNormFloat64 checks RMSNorm and RMSNormBackward, dispatched (AVX2
// where the CPU has it) and plain Go, on one and two cores, against the
// formulas evaluated in float64 here (an independent evaluation, not the
// package's code): r = 1/√(Σx²/n + ε), y = w·x·r, dx = r·(g − x̂·mean(g·x̂))
// with g = dy·w and x̂ = x·r, dw = Σ_rows dy·x̂. Bounds: y and dw within 1e-5
// relative to the sizes summed (a few float32 roundings each); dx, which
// cancels, within 1e-5·r·(|g| + |x̂·mean|) plus the mean's own float32
// error.
func TestRMSNormFloat64(t *testing.T) {
	const eps = 1e-6
	rnd := rand.New(rand.NewPCG(9, 2))
	for _, path := range []string{"dispatched", "go"} {
		useAsmRows(path == "dispatched")
		for _, threads := range []int{1, 2} {
			prev := SetThreads(threads)
			for _, shape := range [][2]int{{1, 1}, {3, 7}, {2, 8}, {5, 9}, {4, 31}, {16, 128}, {64, 2048 + 3}} {
				rows, n := shape[0], shape[1]
				x, w, dy := normInputs(rnd, rows, n)
				y, rstd := make([]float32, rows*n), make([]float32, rows)
				RMSNorm(y, rstd, x, w, n, eps)
				dx, dw := make([]float32, rows*n), make([]float32, n)
				for i := range dx {
					dx[i] = 0.5 // accumulates onto what is there
				}
				RMSNormBackward(dx, dw, dy, x, rstd, w, n)
				dwRef, dwAbs := make([]float64, n), make([]float64, n)
				for i := 0; i < rows; i++ {
					var ss float64
					for j := 0; j < n; j++ {
						ss += float64(x[i*n+j]) * float64(x[i*n+j])
					}
					r := 1 / math.Sqrt(ss/float64(n)+eps)
					if d := math.Abs(float64(rstd[i]) - r); d > 2e-7*r {
						t.Fatalf("%s threads=%d %dx%d: rstd[%d] = %v, want %v", path, threads, rows, n, i, rstd[i], r)
					}
					var dot float64
					for j := 0; j < n; j++ {
						xh := float64(x[i*n+j]) * r
						dot += float64(dy[i*n+j]) * float64(w[j]) * xh
					}
					mean := dot / float64(n)
					for j := 0; j < n; j++ {
						k := i*n + j
						xh := float64(x[k]) * r
						if want := float64(w[j]) * xh; math.Abs(float64(y[k])-want) > 1e-6*math.Abs(want) {
							t.Fatalf("%s threads=%d %dx%d: y[%d] = %v, want %v", path, threads, rows, n, k, y[k], want)
						}
						g := float64(dy[k]) * float64(w[j])
						want := 0.5 + r*(g-xh*mean)
						if tol := 1e-5*r*(math.Abs(g)+math.Abs(xh*mean)) + 1e-6; math.Abs(float64(dx[k])-want) > tol {
							t.Fatalf("%s threads=%d %dx%d: dx[%d] = %v, want %v ± %g", path, threads, rows, n, k, dx[k], want, tol)
						}
						dwRef[j] += float64(dy[k]) * xh
						dwAbs[j] += math.Abs(float64(dy[k]) * xh)
					}
				}
				for j := range dw {
					if math.Abs(float64(dw[j])-dwRef[j]) > 1e-5*dwAbs[j] {
						t.Fatalf("%s threads=%d %dx%d: dw[%d] = %v, want %v", path, threads, rows, n, j, dw[j], dwRef[j])
					}
				}
			}
			SetThreads(prev)
		}
	}
	useAsmRows(true)
}

// TestNormRowsBits: the AVX2 element-wise rows give the plain-Go rows' bits
// for the same r and mean (their products and differences are rounded one
// by one, as the Go statements round them), and the AVX2 sums stay within
// float64 rounding of the plain ones: Σx² within 1e-14 relative, the mean's
// sum of float32 terms within 1e-6 of Σ|terms| (the Go loop sums in
// float32).
func TestNormRowsBits(t *testing.T) {
	rnd := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 100, 2051} {
		x, w, dy := normInputs(rnd, 1, n)
		r, mean := float32(0.7), float32(-0.3)
		run := func(asm bool) (y, dx, dw []float32, ss, dot float64) {
			useAsmRows(asm)
			y, dx, dw = make([]float32, n), make([]float32, n), make([]float32, n)
			for j := range dx {
				dx[j], dw[j] = float32(j%5)-2, float32(j%3)-1
			}
			normScaleRow(y, x, w, r)
			normDxRow(dx, dy, w, x, r, mean)
			normDwRow(dw, dy, x, r)
			return y, dx, dw, normSumSqRow(x), normDotRow(dy, w, x, r)
		}
		yA, dxA, dwA, ssA, dotA := run(true)
		yG, dxG, dwG, ssG, dotG := run(false)
		useAsmRows(true)
		for j := 0; j < n; j++ {
			if math.Float32bits(yA[j]) != math.Float32bits(yG[j]) || math.Float32bits(dxA[j]) != math.Float32bits(dxG[j]) || math.Float32bits(dwA[j]) != math.Float32bits(dwG[j]) {
				t.Fatalf("n=%d j=%d: y %v/%v dx %v/%v dw %v/%v (asm/go)", n, j, yA[j], yG[j], dxA[j], dxG[j], dwA[j], dwG[j])
			}
		}
		if math.Abs(ssA-ssG) > 1e-14*ssG {
			t.Errorf("n=%d: Σx² %v, plain %v", n, ssA, ssG)
		}
		var abs float64
		for j := 0; j < n; j++ {
			abs += math.Abs(float64(dy[j] * w[j] * (x[j] * r)))
		}
		if math.Abs(dotA-dotG) > 1e-6*abs {
			t.Errorf("n=%d: Σ terms %v, plain %v (Σ|terms| %v)", n, dotA, dotG, abs)
		}
	}
}

// TestRMSNormPanics: a row length of zero is a programming error with a
// message, not an integer division by zero.
func TestRMSNormPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"RMSNorm":         func() { RMSNorm(nil, nil, nil, nil, 0, 1e-6) },
		"RMSNormBackward": func() { RMSNormBackward(nil, nil, nil, nil, nil, nil, 0) },
	} {
		func() {
			defer func() {
				if r, ok := recover().(string); !ok || r != "kernel: "+name+": row length n must be positive" {
					t.Errorf("%s with n = 0: recovered %v", name, r)
				}
			}()
			f()
		}()
	}
}
