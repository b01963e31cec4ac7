package numeric

import (
	"context"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// memAccount tracks one rank's live bytes at the modelled dtypes (what a GPU
// would hold: fp32 sharded state, bf16 gathered weights and activations, …),
// not the CPU's float32 buffers.
type memAccount struct {
	live, peak int64
}

func (m *memAccount) alloc(b int64) {
	m.live += b
	m.peak = max(m.peak, m.live)
}

func (m *memAccount) free(b int64) { m.live -= b }

// resetPeak starts a new step's peak from the current live bytes.
func (m *memAccount) resetPeak() { m.peak = m.live }

// rankRecorder receives the reference implementation's records: every
// tensor kept for backward is allocated in the rank's account under the
// layer being run, and released when that layer's backward finishes.
type rankRecorder struct {
	mem  *memAccount
	kept map[int]int64 // layer → bytes kept
	// log, when set, receives every record (tests compare it with memory).
	log *[]moe.SavedRecord

	// During a step (bind, fault.go): the rank's context and endpoint,
	// and whether an injected stall strikes at the next op.
	ctx   context.Context
	ep    *collective.Endpoint
	stall bool
}

// RecordSaved implements moe.Recorder.
func (r *rankRecorder) RecordSaved(s moe.SavedRecord) {
	if r.kept == nil {
		r.kept = map[int]int64{}
	}
	r.kept[s.Layer] += s.Bytes()
	r.mem.alloc(s.Bytes())
	if r.log != nil {
		*r.log = append(*r.log, s)
	}
}

// release frees what layer kept.
func (r *rankRecorder) release(layer int) {
	r.mem.free(r.kept[layer])
	delete(r.kept, layer)
}
