package parallel

import "fmt"

// WithCounts returns rank's program with every token all-to-all sized by
// the routing a run recorded instead of uniform routing: counts[m][r][l][e]
// is how many (token, slot) pairs of rank r's micro-batch m routed to expert
// e in layer l (NumericStep.ExpertCounts). Dispatch and the combine
// gradient send all of the rank's T·K rows (unchanged); combine and the
// dispatch gradient send back the rows the rank received: from every
// member of its EP group, those routed to the experts it owns
// ([ep_index·E/ep, (ep_index+1)·E/ep)). Recomputed forwards exchange as the
// forward did.
func (s *Schedule) WithCounts(m *Mesh, rank int, counts [][][][]int, experts, hidden int) (*Schedule, error) {
	if len(counts) != s.GradAccum {
		return nil, fmt.Errorf("counts for %d micro-steps, schedule has %d", len(counts), s.GradAccum)
	}
	ep := m.Group(AxisEP, rank)
	el := experts / ep.Size()
	lo := m.Coord(rank).EP * el
	out := *s
	out.Ops = append([]ScheduleOp(nil), s.Ops...)
	for i, o := range out.Ops {
		if o.Type != OpCollective || o.Coll != CollAllToAll || o.Purpose == PurposeCounts {
			continue
		}
		mc := counts[o.Micro]
		if len(mc) != m.World() {
			return nil, fmt.Errorf("micro-step %d: counts for %d ranks, world is %d", o.Micro, len(mc), m.World())
		}
		var rows int64
		switch o.Purpose {
		case PurposeDispatch, PurposeCombineBwd:
			for _, c := range mc[rank][o.Layer] {
				rows += int64(c)
			}
		case PurposeCombine, PurposeDispatchBwd:
			for _, src := range ep.Ranks {
				c := mc[src][o.Layer]
				if len(c) != experts {
					return nil, fmt.Errorf("micro-step %d rank %d layer %d: %d expert counts, want %d", o.Micro, src, o.Layer, len(c), experts)
				}
				for e := lo; e < lo+el; e++ {
					rows += int64(c[e])
				}
			}
		}
		out.Ops[i].Elements = rows * int64(hidden)
	}
	return &out, nil
}
