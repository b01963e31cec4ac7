package flops

// AttentionEntries is n, the number of attention scores one query head of
// one sequence of s tokens computes: under the causal mask with window w
// (query i sees keys j with i-w < j ≤ i; w = 0 means no window), counted
// element by element when tile is 1×1, and otherwise as the area of every
// Rows×Cols tile (clipped to the sequence) that holds at least one unmasked
// score. Exact cases: s(s+1)/2 without a window; w(w+1)/2 + (s-w)·w when
// 0 < w < s.
func AttentionEntries(s, w int, tile Tile) int64 {
	if w <= 0 || w > s {
		w = s
	}
	S, W := int64(s), int64(w)
	if tile.Rows == 1 && tile.Cols == 1 {
		return W*(W+1)/2 + (S-W)*W
	}
	R, C := int64(tile.Rows), int64(tile.Cols)
	var n int64
	for r0 := int64(0); r0 < S; r0 += R {
		r1 := min(r0+R, S) // rows [r0, r1)
		// Row i's keys are [i-W+1, i]; over the block they form the
		// contiguous range [lo, hi].
		lo, hi := max(r0-W+1, 0), r1-1
		// The column tiles lo/C … hi/C are contiguous; the last is clipped.
		width := min((hi/C+1)*C, S) - (lo/C)*C
		n += (r1 - r0) * width
	}
	return n
}
