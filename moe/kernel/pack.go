package kernel

// Packing copies a block of op(A) or op(B) into the order the micro-kernel
// reads: A in slivers of mr rows, each stored column by column (mr values
// per reduction step p), B in slivers of nr columns, each stored row by row
// (nr values per p). Slivers are zero-padded to a full mr or nr, so the
// micro-kernel never sees a ragged edge.

// packA writes alpha·op(A)[i0:i0+mc, p0:p0+kc] into ap as ⌈mc/mr⌉ slivers of
// kc·mr values. op(A)[i][p] is a[i·lda+p], or a[p·lda+i] when trans.
func packA(ap []float32, trans bool, a []float32, lda, i0, p0, mc, kc, mr int, alpha float32) {
	for s := 0; s*mr < mc; s++ {
		rows := min(mr, mc-s*mr)
		dst := ap[s*kc*mr : (s+1)*kc*mr]
		if trans {
			for p := 0; p < kc; p++ {
				src := a[(p0+p)*lda+i0+s*mr : (p0+p)*lda+i0+s*mr+rows]
				d := dst[p*mr : p*mr+mr]
				for i, v := range src {
					d[i] = alpha * v
				}
				clear(d[rows:])
			}
			continue
		}
		for i := 0; i < rows; i++ {
			src := a[(i0+s*mr+i)*lda+p0 : (i0+s*mr+i)*lda+p0+kc]
			for p, v := range src {
				dst[p*mr+i] = alpha * v
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
	for s := 0; s*nr < nc; s++ {
		cols := min(nr, nc-s*nr)
		dst := bp[s*kc*nr : (s+1)*kc*nr]
		if !trans {
			for p := 0; p < kc; p++ {
				src := b[(p0+p)*ldb+j0+s*nr : (p0+p)*ldb+j0+s*nr+cols]
				d := dst[p*nr : p*nr+nr]
				copy(d, src)
				clear(d[cols:])
			}
			continue
		}
		for j := 0; j < cols; j++ {
			src := b[(j0+s*nr+j)*ldb+p0 : (j0+s*nr+j)*ldb+p0+kc]
			for p, v := range src {
				dst[p*nr+j] = v
			}
		}
		for j := cols; j < nr; j++ {
			for p := 0; p < kc; p++ {
				dst[p*nr+j] = 0
			}
		}
	}
}
