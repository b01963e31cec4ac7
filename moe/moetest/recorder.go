package moetest

import "github.com/moescope/moescope/moe"

// Recorder is a moe.Recorder that keeps every record, in the order the
// reference implementation reports them.
type Recorder struct {
	Ops   []moe.OpRecord
	Saved []moe.SavedRecord
}

// RecordOp keeps r.
func (rec *Recorder) RecordOp(r moe.OpRecord) { rec.Ops = append(rec.Ops, r) }

// RecordSaved keeps s.
func (rec *Recorder) RecordSaved(s moe.SavedRecord) { rec.Saved = append(rec.Saved, s) }

// OpKey is the identity under which op counts are compared: execution
// may report an op in several records (per expert, per tile), the
// accounting in one.
type OpKey struct {
	Layer int
	Op    moe.Op
	Pass  moe.Pass
}

// OpSums sums the counts of rs per (layer, op, pass).
func OpSums(rs []moe.OpRecord) map[OpKey]int64 {
	s := map[OpKey]int64{}
	for _, r := range rs {
		s[OpKey{r.Layer, r.Op, r.Pass}] += r.Count
	}
	return s
}

// SavedBytes sums the bytes of rs per layer.
func SavedBytes(rs []moe.SavedRecord) map[int]int64 {
	s := map[int]int64{}
	for _, r := range rs {
		s[r.Layer] += r.Bytes()
	}
	return s
}
