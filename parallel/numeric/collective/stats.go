package collective

import (
	"sync"

	"github.com/moescope/moescope/parallel"
)

// Bytes is what one rank moved in one kind of collective, split by
// whether the peer sits on another node.
type Bytes struct {
	Calls     int64
	SentIntra int64
	SentInter int64
	RecvIntra int64
	RecvInter int64
}

// Sent is all bytes sent.
func (b Bytes) Sent() int64 { return b.SentIntra + b.SentInter }

// Recv is all bytes received.
func (b Bytes) Recv() int64 { return b.RecvIntra + b.RecvInter }

func (b *Bytes) add(o Bytes) {
	b.Calls += o.Calls
	b.SentIntra += o.SentIntra
	b.SentInter += o.SentInter
	b.RecvIntra += o.RecvIntra
	b.RecvInter += o.RecvInter
}

// Stats accumulates per rank and per collective kind the bytes each
// rank sends and receives, at the dtype each call names, under NCCL's
// algorithms on a group of n members (member i's ring successor is member
// i+1 mod n, its predecessor i−1):
//
//	all-gather, S = n·c gathered:   send (n−1)·c to the successor, receive as much
//	reduce-scatter, S input:        send (n−1)/n·S, receive as much
//	all-reduce, S buffer:           send ⌊2(n−1)·S/n⌋, receive as much (ring RS + AG)
//	broadcast, S from root:         every member but the root's predecessor sends S
//	                                to its successor; every non-root receives S
//	all-to-all:                     exactly the rows sent to / received from each
//	                                other member (counts × width); own rows stay
//	barrier:                        no bytes
type Stats struct {
	mu     sync.Mutex
	byRank []map[parallel.CollKind]*Bytes
}

// NewStats makes empty statistics for world ranks.
func NewStats(world int) *Stats {
	s := &Stats{byRank: make([]map[parallel.CollKind]*Bytes, world)}
	for r := range s.byRank {
		s.byRank[r] = map[parallel.CollKind]*Bytes{}
	}
	return s
}

// Rank returns rank's totals per kind.
func (s *Stats) Rank(rank int) map[parallel.CollKind]Bytes {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[parallel.CollKind]Bytes{}
	for k, b := range s.byRank[rank] {
		out[k] = *b
	}
	return out
}

// Total sums every rank's bytes per kind.
func (s *Stats) Total() map[parallel.CollKind]Bytes {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[parallel.CollKind]Bytes{}
	for _, m := range s.byRank {
		for k, b := range m {
			t := out[k]
			t.add(*b)
			out[k] = t
		}
	}
	return out
}

// Reset clears all counts.
func (s *Stats) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.byRank {
		s.byRank[r] = map[parallel.CollKind]*Bytes{}
	}
}

// record adds one completed collective.
func (s *Stats) record(m *parallel.Mesh, g parallel.Group, calls []*call) {
	n := len(calls)
	first := calls[0]
	b := first.dtype.Bytes()
	per := make([]Bytes, n)
	ring := func(i int, bytes int64) {
		succ, pred := g.Ranks[(i+1)%n], g.Ranks[(i+n-1)%n]
		me := g.Ranks[i]
		if m.Node(succ) != m.Node(me) {
			per[i].SentInter += bytes
		} else {
			per[i].SentIntra += bytes
		}
		if m.Node(pred) != m.Node(me) {
			per[i].RecvInter += bytes
		} else {
			per[i].RecvIntra += bytes
		}
	}
	for i := range per {
		per[i].Calls = 1
	}
	if n > 1 {
		switch first.kind {
		case parallel.CollAllGather:
			for i := range per {
				ring(i, int64(n-1)*int64(first.size)*b)
			}
		case parallel.CollReduceScatter:
			for i := range per {
				ring(i, int64(n-1)*int64(first.size/n)*b)
			}
		case parallel.CollAllReduce:
			for i := range per {
				ring(i, 2*int64(n-1)*int64(first.size)*b/int64(n))
			}
		case parallel.CollBroadcast:
			S := int64(first.size) * b
			for i := range per {
				me, succ, pred := g.Ranks[i], g.Ranks[(i+1)%n], g.Ranks[(i+n-1)%n]
				if (i+1)%n != first.root {
					if m.Node(succ) != m.Node(me) {
						per[i].SentInter += S
					} else {
						per[i].SentIntra += S
					}
				}
				if i != first.root {
					if m.Node(pred) != m.Node(me) {
						per[i].RecvInter += S
					} else {
						per[i].RecvIntra += S
					}
				}
			}
		case parallel.CollAllToAll:
			w := int64(first.width) * b
			for i, cl := range calls {
				for j, rows := range cl.counts {
					if j == i {
						continue
					}
					by := int64(rows) * w
					if m.Node(g.Ranks[i]) != m.Node(g.Ranks[j]) {
						per[i].SentInter += by
						per[j].RecvInter += by
					} else {
						per[i].SentIntra += by
						per[j].RecvIntra += by
					}
				}
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range g.Ranks {
		t := s.byRank[r][first.kind]
		if t == nil {
			t = &Bytes{}
			s.byRank[r][first.kind] = t
		}
		t.add(per[i])
	}
}
