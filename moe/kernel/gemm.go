package kernel

import "sync"

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices, where
// op(X) is X or Xᵀ. op(A) is m×k, op(B) is k×n, C is m×n; lda, ldb and ldc
// are the row strides of A, B and C as stored. beta = 0 overwrites C without
// reading it (NaNs in C do not propagate), as BLAS does.
//
// The work is BLIS-style: op(B) is packed in kc×nc panels, op(A) in mc×kc
// blocks, and a register-tiled micro-kernel (AVX-512 12×32 or AVX2+FMA 6×16
// in assembly, 4×4 in Go elsewhere) updates C one tile at a time. Large
// products are split over Threads() cores. Sgemm allocates nothing once its
// per-worker buffers have grown to the sizes in use. It panics if a slice is
// too short for its dimensions and stride.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	g := gemmCalls.Get().(*gemmCall)
	*g = gemmCall{mk: active(), transA: transA, transB: transB, m: m, n: n, k: k,
		alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc}
	g.split(Threads())
	shared := g.parts > 1 && g.splitRows && tune.shared
	g.bs = blockSizes(g.mk, shared)
	switch {
	case g.parts == 1:
		ar := arenas.Get().(*arena)
		g.task(ar, 0)
		arenas.Put(ar)
	case shared:
		g.sharedB()
	default:
		parallel(g.parts, g)
	}
	*g = gemmCall{}
	gemmCalls.Put(g)
}

// checkGemm panics with a constant message when the arguments cannot
// describe valid matrices (a programming error, not user input).
func checkGemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic("kernel: Sgemm: negative dimension")
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if !fits(len(a), ar, ac, lda) || !fits(len(b), br, bc, ldb) || !fits(len(c), m, n, ldc) {
		panic("kernel: Sgemm: slice too short for its dimensions and stride")
	}
}

// fits reports whether a rows×cols matrix with row stride ld fits in l
// elements.
func fits(l, rows, cols, ld int) bool {
	if rows == 0 || cols == 0 {
		return true
	}
	return ld >= cols && (rows-1)*ld+cols <= l
}

// scaleC sets C = beta·C (C = 0 when beta = 0).
func scaleC(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// blocking holds the cache block sizes and the order macro visits tiles
// in. By columns (BLIS's order): a kc×nr sliver of packed B stays in L1
// while the mr×kc slivers of an mc×kc block of packed A stream past it from
// L2, and nc bounds the B panel. By rows: an A sliver stays in L1 while the
// B slivers of a kc×nc panel held in L2 stream past it, so C is updated
// along its rows, and mc bounds the A block.
type blocking struct {
	mc, kc, nc int
	rows       bool
}

// blockSizes derives the blocking for micro-kernel mk from the cache sizes
// cpuid reports (common sizes where it does not say) by the rules of this
// part's row of the tuning table (tuning.go; the measurements that set
// them are in tuning_records.json). kc is the largest whose kc×nr B sliver
// fills the row's fraction of L1 (two thirds on every row, after the BLIS
// analytic rule). Where half of L2 holds a B panel at least the row's
// width, tiles go by rows with that panel and an A block in a quarter of
// L2. Otherwise, and for a B panel shared by the cores (shared: sharedB,
// where each core packs half of it, so it is in neither core's L2 whole),
// tiles go by columns with the A block in half of L2 and nc = 4096.
func blockSizes(mk *microKernel, shared bool) blocking {
	l1, l2 := cacheL1, cacheL2
	kc := min(max(l1*tune.kcL1[0]/tune.kcL1[1]/(4*mk.nr), 64), 512) &^ 7
	if nc := l2 / 2 / (4 * kc) / mk.nr * mk.nr; tune.rows > 0 && nc >= tune.rows && !shared {
		mc := min(max(l2/4/(4*kc), mk.mr), 1024) / mk.mr * mk.mr
		return blocking{mc: mc, kc: kc, nc: min(nc, 4096), rows: true}
	}
	mc := min(max(l2/2/(4*kc), mk.mr), 1024) / mk.mr * mk.mr
	return blocking{mc: mc, kc: kc, nc: 4096 / mk.nr * mk.nr}
}

// blockLen splits total into the fewest blocks of at most most (a multiple
// of unit) and returns the block length that makes them equal, rounded up
// to unit: 1024 rows in blocks of at most 504 become 348, 348, 328 rather
// than 504, 504, 16, whose thin last block would run mostly edge tiles.
func blockLen(total, most, unit int) int {
	if total <= most {
		return total
	}
	blocks := (total + most - 1) / most
	return roundUp((total+blocks-1)/blocks, unit)
}

// gemmCall is one Sgemm: its arguments and how C is split into parts, each
// an independent sub-product run on one core.
type gemmCall struct {
	mk             *microKernel
	bs             blocking
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b, c        []float32
	lda, ldb, ldc  int
	parts          int
	splitRows      bool // parts split C's rows (else its columns)
	chunk          int  // rows or columns per part
	// The shared-B panel being multiplied (sharedB): phase, panel origin
	// and size, packed panel.
	phase          int
	jc, nc, pc, kc int
	sharedBP       []float32
}

var gemmCalls = sync.Pool{New: func() any { return new(gemmCall) }}

// parallelMinWork is the m·n·k below which Sgemm stays on one core: a fork
// and join costs a few microseconds, a 64³ product about one.
const parallelMinWork = 96 * 96 * 96

// split chooses the parts: C's rows or columns cut into at most threads
// chunks, along the dimension whose split repacks less (cutting rows makes
// every part pack all of op(B), k·n values; cutting columns, all of op(A)).
func (g *gemmCall) split(threads int) {
	g.parts = 1
	g.splitRows = true
	g.chunk = g.m
	if threads <= 1 || g.m*g.n*g.k < parallelMinWork {
		return
	}
	unit, dim := g.mk.mr, g.m
	g.splitRows = g.m >= g.n
	if !g.splitRows {
		unit, dim = g.mk.nr, g.n
	}
	g.chunk = (dim + threads - 1) / threads
	g.chunk = (g.chunk + unit - 1) / unit * unit
	g.parts = (dim + g.chunk - 1) / g.chunk
}

// Phases of a shared-B call (gemmCall.phase).
const (
	phaseParts = iota // independent parts (task runs block)
	phasePackB        // task t packs its share of the B panel
	phaseRows         // task t multiplies its rows by the packed panel
)

// sharedB runs a row-split call BLIS-style: for every kc×nc panel of op(B),
// the cores first pack a share of it each into one buffer, then each
// multiplies its own rows by the whole panel, so op(B) is packed once, not
// once per core (two fork/joins per panel, about a microsecond each). Only
// where the tuning row says so: on Zen 5 independent parts, each packing
// its own panel, ran faster (record zen5-2026-12-03).
func (g *gemmCall) sharedB() {
	mk, bs := g.mk, g.bs
	if g.beta != 0 && g.beta != 1 {
		scaleC(g.m, g.n, g.beta, g.c, g.ldc)
	}
	ar := arenas.Get().(*arena)
	ncB, kcB := blockLen(g.n, bs.nc, mk.nr), blockLen(g.k, bs.kc, 4)
	bp := ar.scratch(0, kcB*roundUp(ncB, mk.nr))
	g.sharedBP = bp
	for jc := 0; jc < g.n; jc += ncB {
		for pc := 0; pc < g.k; pc += kcB {
			g.jc, g.nc = jc, min(ncB, g.n-jc)
			g.pc, g.kc = pc, min(kcB, g.k-pc)
			g.phase = phasePackB
			parallel(g.parts, g)
			g.phase = phaseRows
			parallel(g.parts, g)
		}
	}
	g.phase, g.sharedBP = phaseParts, nil
	arenas.Put(ar)
}

// task runs part t of the call.
func (g *gemmCall) task(ar *arena, t int) {
	switch g.phase {
	case phasePackB:
		nr := g.mk.nr
		slivers := (g.nc + nr - 1) / nr
		per := (slivers + g.parts - 1) / g.parts
		s0, s1 := t*per, min((t+1)*per, slivers)
		if s0 < s1 {
			packB(g.sharedBP[s0*g.kc*nr:], g.transB, g.b, g.ldb, g.pc, g.jc+s0*nr, g.kc, min(s1*nr, g.nc)-s0*nr, nr)
		}
		return
	case phaseRows:
		mr := g.mk.mr
		i0, i1 := t*g.chunk, min((t+1)*g.chunk, g.m)
		mcB := blockLen(i1-i0, g.bs.mc, mr)
		ar.ap = grow(ar.ap, g.kc*roundUp(mcB, mr))
		acc := g.beta != 0 || g.pc > 0
		for ic := i0; ic < i1; ic += mcB {
			mc := min(mcB, i1-ic)
			packA(ar.ap, g.transA, g.a, g.lda, ic, g.pc, mc, g.kc, mr, g.alpha)
			g.bs.macro(ar, g.mk, g.kc, mc, g.nc, ar.ap, g.sharedBP, g.c[ic*g.ldc+g.jc:], g.ldc, acc)
		}
		return
	}
	i0, i1, j0, j1 := 0, g.m, 0, g.n
	if g.splitRows {
		i0, i1 = t*g.chunk, min((t+1)*g.chunk, g.m)
	} else {
		j0, j1 = t*g.chunk, min((t+1)*g.chunk, g.n)
	}
	g.block(ar, i0, i1, j0, j1)
}

// block computes C[i0:i1, j0:j1] on the calling goroutine.
func (g *gemmCall) block(ar *arena, i0, i1, j0, j1 int) {
	mk, bs := g.mk, g.bs
	mr, nr := mk.mr, mk.nr
	if g.beta != 0 && g.beta != 1 {
		for i := i0; i < i1; i++ {
			row := g.c[i*g.ldc+j0 : i*g.ldc+j1]
			for j := range row {
				row[j] *= g.beta
			}
		}
	}
	ncB, kcB, mcB := blockLen(j1-j0, bs.nc, nr), blockLen(g.k, bs.kc, 4), blockLen(i1-i0, bs.mc, mr)
	ar.bp = grow(ar.bp, kcB*roundUp(ncB, nr))
	ar.ap = grow(ar.ap, kcB*roundUp(mcB, mr))
	for jc := j0; jc < j1; jc += ncB {
		nc := min(ncB, j1-jc)
		for pc := 0; pc < g.k; pc += kcB {
			kc := min(kcB, g.k-pc)
			packB(ar.bp, g.transB, g.b, g.ldb, pc, jc, kc, nc, nr)
			acc := g.beta != 0 || pc > 0
			for ic := i0; ic < i1; ic += mcB {
				mc := min(mcB, i1-ic)
				packA(ar.ap, g.transA, g.a, g.lda, ic, pc, mc, kc, mr, g.alpha)
				bs.macro(ar, mk, kc, mc, nc, ar.ap, ar.bp, g.c[ic*g.ldc+jc:], g.ldc, acc)
			}
		}
	}
}

// macro computes C (+)= A·B for an m×n block of C from packed panels: ap
// holds ⌈m/mr⌉ slivers of kc·mr values (packA's layout), bp ⌈n/nr⌉ slivers
// of kc·nr (packB's), c starts at the block's first element. acc false
// overwrites C. It visits the tiles column of tiles by column (each B
// sliver reused from L1 down the block); macroRows row by row.
func macro(ar *arena, mk *microKernel, kc, m, n int, ap, bp, c []float32, ldc int, acc bool) {
	for jr := 0; jr < n; jr += mk.nr {
		for ir := 0; ir < m; ir += mk.mr {
			tileAt(ar, mk, kc, m, n, ir, jr, ap, bp, c, ldc, acc)
		}
	}
}

// macroRows is macro visiting the tiles row of tiles by row: each A sliver
// is reused from L1 along the block and C is updated along its rows.
func macroRows(ar *arena, mk *microKernel, kc, m, n int, ap, bp, c []float32, ldc int, acc bool) {
	for ir := 0; ir < m; ir += mk.mr {
		for jr := 0; jr < n; jr += mk.nr {
			tileAt(ar, mk, kc, m, n, ir, jr, ap, bp, c, ldc, acc)
		}
	}
}

// tileAt runs the micro-kernel on the tile of C at row ir, column jr of an
// m×n block; a ragged edge tile goes through the arena's tile buffer.
func tileAt(ar *arena, mk *microKernel, kc, m, n, ir, jr int, ap, bp, c []float32, ldc int, acc bool) {
	mr, nr := mk.mr, mk.nr
	mi, nj := min(mr, m-ir), min(nr, n-jr)
	asl, bsl := ap[ir*kc:], bp[jr*kc:]
	co := ir*ldc + jr
	if mi == mr && nj == nr {
		mk.tile(kc, asl, bsl, c[co:], ldc, acc)
		return
	}
	ar.tile = grow(ar.tile, mr*nr)
	tile := ar.tile
	mk.tile(kc, asl, bsl, tile, nr, false)
	for i := 0; i < mi; i++ {
		dst := c[co+i*ldc : co+i*ldc+nj]
		src := tile[i*nr : i*nr+nj]
		if acc {
			for j, v := range src {
				dst[j] += v
			}
		} else {
			copy(dst, src)
		}
	}
}

// macro is macro or macroRows, as the blocking says.
func (bs blocking) macro(ar *arena, mk *microKernel, kc, m, n int, ap, bp, c []float32, ldc int, acc bool) {
	if bs.rows {
		macroRows(ar, mk, kc, m, n, ap, bp, c, ldc, acc)
		return
	}
	macro(ar, mk, kc, m, n, ap, bp, c, ldc, acc)
}

func roundUp(x, unit int) int { return (x + unit - 1) / unit * unit }

// sgemmRef is the plain triple loop every optimized path is tested against.
func sgemmRef(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
}
