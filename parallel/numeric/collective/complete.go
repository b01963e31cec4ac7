package collective

import (
	"fmt"

	"github.com/moescope/moescope/parallel"
)

// complete checks agreement and computes every member's result.
func (c *Comm) complete(s *slot) error {
	if err := s.agree(); err != nil {
		return err
	}
	switch s.calls[0].kind {
	case parallel.CollAllGather:
		s.allGather()
	case parallel.CollReduceScatter:
		s.reduceScatter()
	case parallel.CollAllReduce:
		s.allReduce()
	case parallel.CollBroadcast:
		s.broadcast()
	case parallel.CollAllToAll:
		if err := s.allToAll(); err != nil {
			return err
		}
	case parallel.CollBarrier:
	}
	c.Stats.record(c.mesh, s.group, s.calls)
	return nil
}

// agree returns a mismatch error naming every member's call unless all
// members issued the same op, dtype and parameters (and, but for an
// all-to-all, whose counts may differ freely, the same size).
func (s *slot) agree() error {
	first := s.calls[0]
	for _, cl := range s.calls[1:] {
		same := cl.kind == first.kind && cl.dtype == first.dtype && cl.width == first.width && cl.root == first.root && cl.max == first.max
		if same && cl.kind != parallel.CollAllToAll {
			same = cl.size == first.size
		}
		if !same {
			return &Error{Group: s.key.group, Seq: s.key.seq, Reason: "mismatch", Detail: s.describe()}
		}
	}
	return nil
}

// allGather gives every member the concatenation of the members' inputs in
// group order.
func (s *slot) allGather() {
	n, size := len(s.calls), s.calls[0].size
	for _, cl := range s.calls {
		out := make([]float32, 0, n*size)
		for _, src := range s.calls {
			out = append(out, src.in...)
		}
		cl.out = out
	}
}

// reduceScatter sets member i's out (or adds to it) to the sum of chunk i
// of every member's input, left to right in group order.
func (s *slot) reduceScatter() {
	ch := s.calls[0].size / len(s.calls)
	for i, cl := range s.calls {
		out := cl.out
		for k := 0; k < ch; k++ {
			var v float32
			if cl.add {
				v = out[k]
			}
			for j, src := range s.calls {
				if j == 0 && !cl.add {
					v = src.in[i*ch+k]
					continue
				}
				v += src.in[i*ch+k]
			}
			out[k] = v
		}
	}
}

// allReduce sums (or takes the maximum of) the members' inputs left to
// right in group order; a member that gave an out (AllReduceAdd) has the
// sum added to it, the others get it in place of their input.
func (s *slot) allReduce() {
	first := s.calls[0]
	sum := make([]float32, first.size)
	copy(sum, s.calls[0].in)
	for _, src := range s.calls[1:] {
		for k, x := range src.in {
			if first.max {
				sum[k] = max(sum[k], x)
			} else {
				sum[k] += x
			}
		}
	}
	for _, cl := range s.calls {
		if cl.out == nil {
			continue
		}
		// AllReduceAdd: out + in_0 + in_1 + … left to right.
		for k := range cl.out {
			v := cl.out[k]
			for _, src := range s.calls {
				v += src.in[k]
			}
			cl.out[k] = v
		}
	}
	for _, cl := range s.calls {
		if cl.out == nil {
			copy(cl.in, sum) // in place, after every input was read
		}
	}
}

// broadcast copies the root member's buffer into every other member's.
func (s *slot) broadcast() {
	first := s.calls[0]
	root := s.calls[first.root].in
	for i, cl := range s.calls {
		if i != first.root {
			copy(cl.in, root)
		}
	}
}

// allToAll gives member i the rows every member sent it, member 0's
// first, and how many came from each; a member whose send counts do not
// name every member is a mismatch.
func (s *slot) allToAll() error {
	n, width := len(s.calls), s.calls[0].width
	for _, cl := range s.calls {
		if len(cl.counts) != n {
			return &Error{Group: s.key.group, Seq: s.key.seq, Reason: "mismatch",
				Detail: fmt.Sprintf("rank %d gives %d send counts for %d members", cl.rank, len(cl.counts), n)}
		}
	}
	for i, cl := range s.calls {
		cl.recvCounts = make([]int, n)
		var out []float32
		for j, src := range s.calls {
			off := 0
			for p := 0; p < i; p++ {
				off += src.counts[p]
			}
			rows := src.counts[i]
			cl.recvCounts[j] = rows
			out = append(out, src.in[off*width:(off+rows)*width]...)
		}
		cl.out = out
	}
	return nil
}
