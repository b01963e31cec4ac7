package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// forEachPath runs f on every micro-kernel this machine can run, on one
// and two threads, with the L2 sizes of a 512 KiB and a 2 MiB core
// (blockSizes chooses the tile order, rows or columns, from the cache
// sizes) and, on two threads, with a row split's B panel shared by the
// cores and packed by each (the tuning rows differ there), so every
// dispatch path is compared with sgemmRef on any host.
func forEachPath(t *testing.T, f func(t *testing.T)) {
	for _, name := range KernelNames() {
		for _, threads := range []int{1, 2} {
			for _, l2 := range []int{512 << 10, 2 << 20} {
				for _, shared := range []bool{false, true} {
					if threads == 1 && shared {
						continue
					}
					t.Run(fmt.Sprintf("%s/threads=%d/l2=%dKiB/sharedB=%v", name, threads, l2>>10, shared), func(t *testing.T) {
						restore, _ := UseKernel(name)
						defer restore()
						prev := SetThreads(threads)
						defer SetThreads(prev)
						defer func(l2 int, tu tuning) { cacheL2, tune = l2, tu }(cacheL2, tune)
						cacheL2, tune.shared = l2, shared
						f(t)
					})
				}
			}
		}
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

// gemmCase runs one Sgemm against sgemmRef; pad adds to every stride.
func gemmCase(t *testing.T, r *rand.Rand, transA, transB bool, m, n, k, pad int, alpha, beta float32) {
	t.Helper()
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	lda, ldb, ldc := ac+pad, bc+pad, n+pad
	a := randSlice(r, max(ar*lda, 1))
	b := randSlice(r, max(br*ldb, 1))
	c := randSlice(r, max(m*ldc, 1))
	if beta == 0 {
		for i := range c {
			c[i] = float32(math.NaN()) // must not leak through beta = 0
		}
	}
	want := append([]float32(nil), c...)
	sgemmRef(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
	Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	// Each entry sums k products of values in [-1, 1]: the float32
	// reassociation error is below k·2⁻²³ per unit of |alpha|, plus beta·C.
	tol := float64(k)*1.2e-7*float64(abs32(alpha))*4 + 1e-6
	for i := 0; i < m; i++ {
		for j := 0; j < ldc && i*ldc+j < len(c); j++ {
			g, w := c[i*ldc+j], want[i*ldc+j]
			if j >= n { // padding must be untouched
				if !(g == w || (g != g && w != w)) {
					t.Fatalf("%v%v m=%d n=%d k=%d pad=%d: padding C[%d][%d] changed", transA, transB, m, n, k, pad, i, j)
				}
				continue
			}
			if d := math.Abs(float64(g - w)); !(d <= tol) {
				t.Fatalf("transA=%v transB=%v m=%d n=%d k=%d pad=%d alpha=%v beta=%v: C[%d][%d] = %v, want %v (tol %g)",
					transA, transB, m, n, k, pad, alpha, beta, i, j, g, w, tol)
			}
		}
	}
}

func abs32(x float32) float32 { return float32(math.Abs(float64(x))) }

func TestSgemmEdges(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		dims := []int{1, 2, 5, 6, 7, 11, 12, 13, 16, 17, 31, 32, 33, 63}
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for range 40 {
					m, n, k := dims[r.IntN(len(dims))], dims[r.IntN(len(dims))], dims[r.IntN(len(dims))]
					gemmCase(t, r, ta, tb, m, n, k, r.IntN(3), 1, 0)
				}
			}
		}
	})
}

func TestSgemmBlocks(t *testing.T) {
	// Sizes that cross the kc, mc and parallel-split boundaries of every
	// kernel's blocking, with alpha and beta away from 0 and 1.
	forEachPath(t, func(t *testing.T) {
		// m = 700 crosses mc, k = 1030 crosses kc two or more times, n =
		// 300 crosses the parallel split, for every kernel's blocking.
		r := rand.New(rand.NewPCG(3, 4))
		ab := [][2]float32{{0.5, 0}, {-1.5, 0.75}, {1, 1}}
		// {300, 97, 600} and {250, 250, 530} split rows over threads,
		// sharing the packed B panels on the sharedB paths.
		// {29, 1031, 263} crosses nc = 1024 (blocking by rows) and kc with
		// primes, so the last tile row, column and panel are ragged.
		for i, s := range [][3]int{{97, 130, 600}, {700, 20, 40}, {40, 300, 1030}, {130, 97, 7}, {300, 97, 600}, {250, 250, 530}, {29, 1031, 263}} {
			for j, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				c := ab[(i+j)%len(ab)]
				gemmCase(t, r, tr[0], tr[1], s[0], s[1], s[2], (i+j)%3, c[0], c[1])
			}
		}
	})
}

func TestBlockLen(t *testing.T) {
	// Hand-derived: ⌈total/most⌉ blocks, each ⌈total/blocks⌉ rounded up to
	// unit, the last one shorter.
	for _, c := range []struct{ total, most, unit, want int }{
		{100, 256, 4, 100},    // one block, as it is
		{256, 256, 4, 256},    // exactly one block
		{300, 256, 4, 152},    // 2 blocks: 150 → 152, last 148
		{1024, 504, 12, 348},  // 3 blocks: 342 → 348, last 328
		{1025, 1024, 32, 544}, // 2 blocks: 513 → 544, last 481
		{2048, 1024, 32, 1024},
	} {
		if got := blockLen(c.total, c.most, c.unit); got != c.want {
			t.Errorf("blockLen(%d, %d, %d) = %d, want %d", c.total, c.most, c.unit, got, c.want)
		}
	}
}

func TestBlockSizes(t *testing.T) {
	defer func(l1, l2 int, tu tuning) { cacheL1, cacheL2, tune = l1, l2, tu }(cacheL1, cacheL2, tune)
	k12x32, k6x16 := &microKernel{mr: 12, nr: 32}, &microKernel{mr: 6, nr: 16}
	// Hand-derived from blockSizes' rule: kc = ⌊L1·2/3/(4·nr)⌋ &^ 7 in
	// [64, 512]; by rows when ⌊L2/2/(4·kc)⌋ (to nr) ≥ 1024 and the panel
	// is not shared, then mc = ⌊L2/4/(4·kc)⌋ to mr; by columns mc =
	// ⌊L2/2/(4·kc)⌋ to mr, nc = 4096.
	for _, c := range []struct {
		name   string // the tuning row, then the kernel
		l1, l2 int
		mk     *microKernel
		want   blocking
		shared blocking // a B panel shared by the cores: always by columns
	}{
		// Sapphire Rapids: kc = 32768/128 = 256, nc = 1 MiB/1 KiB = 1024,
		// mc = 512 → 504; shared, by columns: mc = 1 MiB/1 KiB = 1024 →
		// 1020.
		{"sapphirerapids 12x32", 48 << 10, 2 << 20, k12x32, blocking{mc: 504, kc: 256, nc: 1024, rows: true}, blocking{mc: 1020, kc: 256, nc: 4096}},
		// kc = 32768/64 = 512, nc = 1 MiB/2 KiB = 512 < 1024: by columns,
		// mc = 1 MiB/2 KiB = 512 → 510.
		{"sapphirerapids 6x16", 48 << 10, 2 << 20, k6x16, blocking{mc: 510, kc: 512, nc: 4096}, blocking{mc: 510, kc: 512, nc: 4096}},
		// Zen 5 (1 MiB L2): kc = 256, nc = 512 KiB/1 KiB = 512: by columns,
		// mc = 512 → 504.
		{"zen5 12x32", 48 << 10, 1 << 20, k12x32, blocking{mc: 504, kc: 256, nc: 4096}, blocking{mc: 504, kc: 256, nc: 4096}},
		// Zen 3 (32 KiB L1, 512 KiB L2): kc = 21845/64 = 341 → 336, mc =
		// 262144/1344 = 195 → 192.
		{"zen3 6x16", 32 << 10, 512 << 10, k6x16, blocking{mc: 192, kc: 336, nc: 4096}, blocking{mc: 192, kc: 336, nc: 4096}},
	} {
		cacheL1, cacheL2 = c.l1, c.l2
		tune = tuningRow(t, strings.Fields(c.name)[0])
		if got := blockSizes(c.mk, false); got != c.want {
			t.Errorf("%s: blockSizes = %+v, want %+v", c.name, got, c.want)
		}
		if got := blockSizes(c.mk, true); got != c.shared {
			t.Errorf("%s: blockSizes(shared) = %+v, want %+v", c.name, got, c.shared)
		}
	}
}

func TestSgemmDegenerate(t *testing.T) {
	// k = 0 or alpha = 0: C = beta·C, hand-computed.
	c := []float32{1, 2, 3, 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 2, 0.5, c, 2)
	if c[0] != 0.5 || c[3] != 2 {
		t.Fatalf("k=0, beta=0.5: got %v", c)
	}
	Sgemm(false, false, 2, 2, 1, 0, []float32{1, 1}, 1, []float32{1, 1}, 2, 0, c, 2)
	if c[0] != 0 || c[3] != 0 {
		t.Fatalf("alpha=0, beta=0: got %v", c)
	}
	// [1 2; 3 4]·[5 6; 7 8] = [19 22; 43 50].
	a, b := []float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}
	forEachPath(t, func(t *testing.T) {
		c := make([]float32, 4)
		Sgemm(false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2)
		if c[0] != 19 || c[1] != 22 || c[2] != 43 || c[3] != 50 {
			t.Fatalf("got %v, want [19 22 43 50]", c)
		}
	})
}

func TestSgemmPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("short slice did not panic")
		}
	}()
	Sgemm(false, false, 2, 2, 2, 1, make([]float32, 3), 2, make([]float32, 4), 2, 0, make([]float32, 4), 2)
}

func TestSgemmNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	r := rand.New(rand.NewPCG(5, 6))
	const n = 200
	a, b, c := randSlice(r, n*n), randSlice(r, n*n), make([]float32, n*n)
	for _, threads := range []int{1, 2} {
		prev := SetThreads(threads)
		Sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n)
		allocs := testing.AllocsPerRun(20, func() { Sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n) })
		SetThreads(prev)
		// sync.Pool may drop an arena at a GC; allow that rarely.
		if allocs > 0.5 {
			t.Errorf("threads=%d: %v allocations per Sgemm, want 0", threads, allocs)
		}
	}
}

func FuzzSgemm(f *testing.F) {
	f.Add(uint8(5), uint8(7), uint8(3), false, true, uint8(1), uint64(1))
	f.Add(uint8(13), uint8(33), uint8(64), true, false, uint8(0), uint64(2))
	f.Add(uint8(1), uint8(1), uint8(1), true, true, uint8(2), uint64(3))
	f.Fuzz(func(t *testing.T, m, n, k uint8, ta, tb bool, pad uint8, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 7))
		for _, name := range KernelNames() {
			restore, _ := UseKernel(name)
			gemmCase(t, r, ta, tb, int(m)%80, int(n)%80, int(k)%80, int(pad)%4, 1, 0.5)
			restore()
		}
	})
}

// TestSgemmPackGo runs the Go packing loops that the assembly transposes
// replace (the purego path's packing) through every layout.
func TestSgemmPackGo(t *testing.T) {
	usePackAsm = false
	defer func() { usePackAsm = true }()
	r := rand.New(rand.NewPCG(8, 9))
	for j, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		gemmCase(t, r, tr[0], tr[1], 50, 70, 300+j, j%2, 1, 0.5)
	}
}

// TestPackBLayout checks packB against its definition, written out here:
// sliver s holds rows p < kc of op(B)[p0+p][j0+s·nr+j] at s·kc·nr + p·nr + j,
// zero beyond column nc, for widths that leave a ragged last sliver and
// heights that leave a ragged last row group, both layouts, Go and
// assembly copies.
func TestPackBLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, asm := range []bool{true, false} {
		usePackAsm = asm
		for _, nr := range []int{4, 16, 32} {
			for _, trans := range []bool{false, true} {
				for _, dims := range [][2]int{{1, 1}, {7, 2 * nr}, {13, 3*nr + 5}, {17, nr - 1}, {64, 5 * nr}} {
					kc, nc := dims[0], dims[1]
					p0, j0, ld := 3, 2, nc+kc+9
					b := randSlice(r, (p0+kc+nc+j0+4)*ld)
					slivers := (nc + nr - 1) / nr
					bp := randSlice(r, slivers*kc*nr)
					packB(bp, trans, b, ld, p0, j0, kc, nc, nr)
					for s := 0; s < slivers; s++ {
						for p := 0; p < kc; p++ {
							for j := 0; j < nr; j++ {
								var want float32
								if col := s*nr + j; col < nc {
									if trans {
										want = b[(j0+col)*ld+p0+p]
									} else {
										want = b[(p0+p)*ld+j0+col]
									}
								}
								if got := bp[s*kc*nr+p*nr+j]; got != want {
									t.Fatalf("asm=%v nr=%d trans=%v kc=%d nc=%d: sliver %d row %d col %d = %v, want %v", asm, nr, trans, kc, nc, s, p, j, got, want)
								}
							}
						}
					}
				}
			}
		}
	}
	usePackAsm = true
}
