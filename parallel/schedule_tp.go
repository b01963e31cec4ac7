package parallel

// tpAt returns the tensor-parallel collectives of layer placed before
// (after = false) or after the compute of (ph, seg).
func (b *schedBuilder) tpAt(layer int, ph Phase, seg Segment, after bool) []TPColl {
	var out []TPColl
	for _, c := range b.tp[layer] {
		if c.Phase == ph && c.Segment == seg && c.After == after {
			out = append(out, c)
		}
	}
	return out
}

// tpColl emits one tensor-parallel collective after deps on the tp group
// and returns the op the computation waits for, with overlapped appended
// the id of its overlapped part, if any. Under async TP an all-gather or
// reduce-scatter is decomposed as torch's micro-pipeline TP does (the
// collective split into tp chunks, each overlapped with the matmul on the
// previous one): the first chunk, S/tp, is exposed; the other (tp−1)/tp·S
// are an AsyncPart op beside the compute, which the computation waits for
// one segment later.
func (b *schedBuilder) tpColl(micro, layer int, c TPColl, deps []int, overlapped []int) (int, []int) {
	o := ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: layer, Deps: deps,
		Coll: c.Coll, Axis: AxisTP, Purpose: c.Purpose, DType: c.DType, Elements: c.Elements}
	if !b.l.AsyncTP || c.Coll == CollAllReduce {
		return b.add(o), overlapped
	}
	tp := int64(b.l.TPDegree())
	first := c.Elements / tp
	o.Elements = first
	id := b.add(o)
	o.Elements, o.AsyncPart, o.Deps = c.Elements-first, true, []int{id}
	return id, append(overlapped, b.add(o))
}
