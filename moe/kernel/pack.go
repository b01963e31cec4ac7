package kernel

// Packing copies a block of op(A) or op(B) into the order the micro-kernel
// reads: A in slivers of mr rows, each stored column by column (mr values
// per reduction step p), B in slivers of nr columns, each stored row by row
// (nr values per p). Slivers are zero-padded to a full mr or nr, so the
// micro-kernel never sees a ragged edge.

// Block transposes in assembly, nil where unavailable; usePackAsm switches
// them off in tests. asmTranspose8(dst, ldd, src, lds, n, alpha) writes
// dst[(8b+c)·ldd+r] = alpha·src[r·lds+8b+c] for r, c < 8, b < n;
// asmTranspose4 the same for r < 4. The caller guarantees the extents.
var (
	asmTranspose8, asmTranspose4 func(dst []float32, ldd int, src []float32, lds, n int, alpha float32)
	// asmCopyRows(dst, src, ld, kc, w) does copyRows for w in {4, 6, 12,
	// 16, 32} and returns false otherwise.
	asmCopyRows func(dst, src []float32, ld, kc, w int) bool
	usePackAsm  = true
)

// packA writes alpha·op(A)[i0:i0+mc, p0:p0+kc] into ap as ⌈mc/mr⌉ slivers of
// kc·mr values. op(A)[i][p] is a[i·lda+p], or a[p·lda+i] when trans.
func packA(ap []float32, trans bool, a []float32, lda, i0, p0, mc, kc, mr int, alpha float32) {
	for s := 0; s*mr < mc; s++ {
		rows := min(mr, mc-s*mr)
		dst := ap[s*kc*mr : (s+1)*kc*mr]
		if trans && rows == mr && alpha == 1 && copyRows(dst, a, (p0)*lda+i0+s*mr, lda, kc, mr) {
			continue
		}
		if trans {
			for p := 0; p < kc; p++ {
				src := a[(p0+p)*lda+i0+s*mr : (p0+p)*lda+i0+s*mr+rows]
				d := dst[p*mr : p*mr+mr]
				if alpha == 1 {
					copy(d, src)
				} else {
					for i, v := range src {
						d[i] = alpha * v
					}
				}
				clear(d[rows:])
			}
			continue
		}
		first := 0 // rows [0, first) and steps [0, done) packed by the transposes
		done := 0
		if usePackAsm && asmTranspose4 != nil && rows == mr && kc >= 8 && mr >= 4 {
			done = kc &^ 7
			row := (i0+s*mr)*lda + p0
			for first < mr {
				switch {
				case mr-first >= 8:
					asmTranspose8(dst[first:], mr, a[row+first*lda:], lda, done/8, alpha)
					first += 8
				case mr-first >= 4:
					asmTranspose4(dst[first:], mr, a[row+first*lda:], lda, done/8, alpha)
					first += 4
				default:
					// The last 1–3 rows (mr = 6: AVX2's two): the four rows
					// ending at mr, rewriting rows already packed with the
					// same values.
					asmTranspose4(dst[mr-4:], mr, a[row+(mr-4)*lda:], lda, done/8, alpha)
					first = mr
				}
			}
		}
		for i := 0; i < rows; i++ {
			start := done
			if i >= first {
				start = 0
			}
			src := a[(i0+s*mr+i)*lda+p0 : (i0+s*mr+i)*lda+p0+kc]
			for p := start; p < kc; p++ {
				dst[p*mr+i] = alpha * src[p]
			}
		}
		for i := rows; i < mr; i++ {
			for p := 0; p < kc; p++ {
				dst[p*mr+i] = 0
			}
		}
	}
}

// packB writes op(B)[p0:p0+kc, j0:j0+nc] into bp as ⌈nc/nr⌉ slivers of kc·nr
// values. op(B)[p][j] is b[p·ldb+j], or b[j·ldb+p] when trans.
func packB(bp []float32, trans bool, b []float32, ldb, p0, j0, kc, nc, nr int) {
	if full := nc / nr; !trans && full > 1 {
		// Full slivers row group by row group: each group reads its rows
		// left to right, as the prefetchers follow, where one sliver at a
		// time reads nr values from every row, ldb apart. Paired against
		// sliver by sliver on the Sapphire Rapids guest with the sources
		// out of cache (one process, alternating, median of 15 time
		// ratios): Sgemm 1.00–1.05× on one core over 1024³, 2048³ and the
		// expert shapes on both kernels, 0.96–1.03× on two.
		for p := 0; p < kc; p += packRowGroup {
			g := min(packRowGroup, kc-p)
			for s := 0; s < full; s++ {
				copyRows(bp[s*kc*nr+p*nr:], b, (p0+p)*ldb+j0+s*nr, ldb, g, nr)
			}
		}
		if full*nr < nc {
			packB(bp[full*kc*nr:], false, b, ldb, p0, j0+full*nr, kc, nc-full*nr, nr)
		}
		return
	}
	for s := 0; s*nr < nc; s++ {
		cols := min(nr, nc-s*nr)
		dst := bp[s*kc*nr : (s+1)*kc*nr]
		if !trans && cols == nr && copyRows(dst, b, p0*ldb+j0+s*nr, ldb, kc, nr) {
			continue
		}
		if !trans {
			for p := 0; p < kc; p++ {
				src := b[(p0+p)*ldb+j0+s*nr : (p0+p)*ldb+j0+s*nr+cols]
				d := dst[p*nr : p*nr+nr]
				copy(d, src)
				clear(d[cols:])
			}
			continue
		}
		first, done := 0, 0 // columns [0, first) and steps [0, done) packed by the transposes
		if usePackAsm && asmTranspose4 != nil && cols == nr && kc >= 8 && nr%4 == 0 {
			done = kc &^ 7
			col := (j0+s*nr)*ldb + p0
			for first < nr {
				if nr-first >= 8 {
					asmTranspose8(dst[first:], nr, b[col+first*ldb:], ldb, done/8, 1)
					first += 8
				} else {
					asmTranspose4(dst[first:], nr, b[col+first*ldb:], ldb, done/8, 1)
					first += 4
				}
			}
		}
		for j := 0; j < cols; j++ {
			start := done
			if j >= first {
				start = 0
			}
			src := b[(j0+s*nr+j)*ldb+p0 : (j0+s*nr+j)*ldb+p0+kc]
			for p := start; p < kc; p++ {
				dst[p*nr+j] = src[p]
			}
		}
		for j := cols; j < nr; j++ {
			for p := 0; p < kc; p++ {
				dst[p*nr+j] = 0
			}
		}
	}
}

// packRowGroup is how many rows of op(B) packB copies across all full
// slivers before moving on.
const packRowGroup = 8

// copyRows copies rows p < kc of w values, src[off+p·ld:][:w], to
// dst[p·w:][:w], for the widths of the micro-kernels: in assembly where
// available (asmCopyRows), else as fixed-size array copies (a copy call per
// 48 or 128 bytes cost a third of attention's backward). It returns false
// for other widths.
func copyRows(dst, src []float32, off, ld, kc, w int) bool {
	if kc == 0 {
		return true
	}
	if usePackAsm && asmCopyRows != nil {
		_ = dst[(kc-1)*w+w-1]      // bounds, once
		_ = src[off+(kc-1)*ld+w-1] // bounds, once
		if asmCopyRows(dst, src[off:], ld, kc, w) {
			return true
		}
	}
	switch w {
	case 32:
		for p := 0; p < kc; p++ {
			*(*[32]float32)(dst[p*32:]) = *(*[32]float32)(src[off+p*ld:])
		}
	case 16:
		for p := 0; p < kc; p++ {
			*(*[16]float32)(dst[p*16:]) = *(*[16]float32)(src[off+p*ld:])
		}
	case 12:
		for p := 0; p < kc; p++ {
			*(*[12]float32)(dst[p*12:]) = *(*[12]float32)(src[off+p*ld:])
		}
	case 6:
		for p := 0; p < kc; p++ {
			*(*[6]float32)(dst[p*6:]) = *(*[6]float32)(src[off+p*ld:])
		}
	case 4:
		for p := 0; p < kc; p++ {
			*(*[4]float32)(dst[p*4:]) = *(*[4]float32)(src[off+p*ld:])
		}
	default:
		return false
	}
	return true
}
