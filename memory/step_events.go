package memory

import (
	"slices"

	"github.com/moescope/moescope/moe"
)

// recordSet is records with the label each one's events carry.
type recordSet struct {
	rs     []moe.SavedRecord
	labels []string
}

// labelled labels rs with prefix; the labels name no layer, so one
// string serves every unit (interned in s.labelOf).
func (s *stepBuilder) labelled(prefix string, rs []moe.SavedRecord) *recordSet {
	set := &recordSet{rs: rs, labels: make([]string, len(rs))}
	if s.labelOf == nil {
		s.labelOf = map[[3]string]string{}
	}
	for k, r := range rs {
		key := [3]string{prefix, string(r.Op), string(r.Tensor)}
		l, ok := s.labelOf[key]
		if !ok {
			l = prefix + " " + string(r.Op) + " " + string(r.Tensor)
			s.labelOf[key] = l
		}
		set.labels[k] = l
	}
	return set
}

// savedSet is unit i's saved records labelled "saved".
func (s *stepBuilder) savedSet(i int) *recordSet {
	if s.savedSets == nil {
		s.savedSets = make([]*recordSet, len(s.units))
	}
	if s.savedSets[i] == nil {
		s.savedSets[i] = s.labelled("saved", s.saved[i])
	}
	return s.savedSets[i]
}

// recSet is what block unit i's backward recomputes (missing), labelled
// "recompute".
func (s *stepBuilder) recSet(i int) *recordSet {
	if s.recSets == nil {
		s.recSets = make([]*recordSet, len(s.units))
	}
	if s.recSets[i] == nil {
		s.recSets[i] = s.labelled("recompute", missing(s.none[i], s.saved[i]))
	}
	return s.recSets[i]
}

// lossSavedSet is the loss's own saved records labelled "saved".
func (s *stepBuilder) lossSavedSet() *recordSet {
	if s.lossSet == nil {
		s.lossSet = s.labelled("saved", s.lossSaved)
	}
	return s.lossSet
}

func (s *stepBuilder) emit(alloc bool, layer int, label string, bytes int64, c Category, st Stream) {
	if bytes <= 0 {
		return
	}
	s.events = append(s.events, Event{Phase: s.phase, Micro: s.micro, Layer: layer, Label: label,
		Alloc: alloc, Bytes: bytes, Category: c, Stream: st})
}

func (s *stepBuilder) alloc(layer int, label string, n int64, c Category) {
	s.emit(true, layer, label, n, c, ComputeStream)
}

func (s *stepBuilder) free(layer int, label string, n int64, c Category) {
	s.emit(false, layer, label, n, c, ComputeStream)
}

func (s *stepBuilder) allocOn(st Stream, layer int, label string, n int64) {
	s.emit(true, layer, label, n, CatComm, st)
}

func (s *stepBuilder) freeOn(st Stream, layer int, label string, n int64) {
	s.emit(false, layer, label, n, CatComm, st)
}

// allocRecords allocates one tensor per record of set (labelled prefix,
// op, tensor; nil allocates nothing).
func (s *stepBuilder) allocRecords(set *recordSet, c Category) {
	if set == nil {
		return
	}
	for k, r := range set.rs {
		s.alloc(r.Layer, set.labels[k], r.Bytes(), c)
	}
}

func (s *stepBuilder) freeRecords(set *recordSet, c Category) {
	if set == nil {
		return
	}
	for k, r := range set.rs {
		s.free(r.Layer, set.labels[k], r.Bytes(), c)
	}
}

// missing returns the records of none that saved lacks (by op and tensor):
// what backward rebuilds by recomputation.
func missing(none, saved []moe.SavedRecord) []moe.SavedRecord {
	out := make([]moe.SavedRecord, 0, len(none)) // at most all of none: one allocation
	for _, r := range none {
		// A unit keeps tens of records: a scan is cheaper than a set.
		if !slices.ContainsFunc(saved, func(x moe.SavedRecord) bool { return x.Op == r.Op && x.Tensor == r.Tensor }) {
			out = append(out, r)
		}
	}
	return out
}

// emitAt emits an event of micro-step m from inside another one: the free
// of a buffer allocated in an earlier micro-step names that micro-step.
func (s *stepBuilder) emitAt(m int, alloc bool, layer int, label string, bytes int64, c Category, st Stream) {
	cur := s.micro
	s.micro = m
	s.emit(alloc, layer, label, bytes, c, st)
	s.micro = cur
}
