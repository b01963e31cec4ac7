package flops

// ChunkedEntries is n for Llama 4's chunked attention (moe/llama4.go):
// query i of a sequence of s tokens sees keys j ≤ i with ⌊j/c⌋ = ⌊i/c⌋, so
// the mask is block-diagonal with causal blocks of c. Counted element by
// element when tile is 1×1, q·c(c+1)/2 + r(r+1)/2 with s = q·c + r; otherwise
// the area of every Rows×Cols tile (clipped to the sequence) that holds at
// least one unmasked score. c ≤ 0 or c ≥ s is plain causal attention.
func ChunkedEntries(s, c int, tile Tile) int64 {
	if c <= 0 || c >= s {
		return AttentionEntries(s, 0, tile)
	}
	S, C := int64(s), int64(c)
	if tile.Rows == 1 && tile.Cols == 1 {
		q, r := S/C, S%C
		return q*C*(C+1)/2 + r*(r+1)/2
	}
	R, W := int64(tile.Rows), int64(tile.Cols)
	var n int64
	for r0 := int64(0); r0 < S; r0 += R {
		r1 := min(r0+R, S) // rows [r0, r1)
		// The rows of chunk k in the block see keys [k·C, last row of k];
		// the chunks' key ranges increase, so their column tiles form
		// increasing runs, counted once where consecutive runs share a tile.
		prevHi := int64(-1)
		for k := r0 / C; k*C < r1; k++ {
			hi := min((k+1)*C, r1) - 1 // last row of chunk k in the block
			lo := (k * C) / W          // first column tile
			top := hi / W              // last column tile
			lo = max(lo, prevHi+1)
			for t := lo; t <= top; t++ {
				n += (r1 - r0) * (min((t+1)*W, S) - t*W)
			}
			prevHi = max(prevHi, top)
		}
	}
	return n
}
