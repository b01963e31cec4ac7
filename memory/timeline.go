package memory

import (
	"fmt"
	"maps"
	"slices"
)

// Phase is the part of a training step an event belongs to.
type Phase string

// Phases of a step.
const (
	Setup     Phase = "setup"     // what is live when the step begins (steady state)
	Forward   Phase = "forward"   // one micro-step's forward
	Backward  Phase = "backward"  // one micro-step's backward
	Optimizer Phase = "optimizer" // the AdamW step and zero_grad
)

// Category classifies live bytes for the breakdown.
type Category string

// Categories of the breakdown.
const (
	CatParams      Category = "parameters"       // stored (sharded) parameters and buffers
	CatGrads       Category = "gradients"        // reduced gradients kept until the optimizer step
	CatOptimizer   Category = "optimizer"        // AdamW moments and master weights
	CatWeights     Category = "gathered_weights" // unsharded compute-dtype weights
	CatActivations Category = "activations"      // tensors saved for backward
	CatRecompute   Category = "recompute"        // activations rebuilt by checkpointing in backward
	CatLoss        Category = "loss"             // logits and their gradients (vocabulary × tokens)
	CatWorkspace   Category = "workspace"        // op intermediates and activation gradients
	CatUnshardGrad Category = "unsharded_grads"  // a unit's weight gradients before reduction
	CatComm        Category = "comm_buffers"     // all-gather, reduce-scatter and all-to-all buffers
	CatOptTemp     Category = "optimizer_temps"  // temporaries of the foreach AdamW step
	CatGraphs      Category = "cuda_graphs"      // static buffers of captured CUDA graphs (graphs.go)
)

// Categories returns the categories in report order (a new slice each call).
func Categories() []Category { return slices.Clone(categories[:]) }

const numCategories = 12

var categories = [numCategories]Category{CatParams, CatGrads, CatOptimizer, CatWeights, CatActivations, CatRecompute,
	CatLoss, CatWorkspace, CatUnshardGrad, CatComm, CatOptTemp, CatGraphs}

// categoryIndex is c's index in categories, -1 for another.
func categoryIndex(c Category) int {
	switch c {
	case CatParams:
		return 0
	case CatGrads:
		return 1
	case CatOptimizer:
		return 2
	case CatWeights:
		return 3
	case CatActivations:
		return 4
	case CatRecompute:
		return 5
	case CatLoss:
		return 6
	case CatWorkspace:
		return 7
	case CatUnshardGrad:
		return 8
	case CatComm:
		return 9
	case CatOptTemp:
		return 10
	case CatGraphs:
		return 11
	}
	return -1
}

// Stream is the CUDA stream a buffer is allocated on. The caching
// allocator keeps freed blocks per stream, so a stream's cache serves only
// that stream.
type Stream string

// Streams (FSDP2 allocates all-gather outputs on its all-gather stream and
// reduce-scatter buffers and outputs, hence the gradients, on its
// reduce-scatter stream; everything else is on the compute stream).
const (
	ComputeStream       Stream = "compute"
	AllGatherStream     Stream = "all_gather"
	ReduceScatterStream Stream = "reduce_scatter"
)

// Streams returns the streams in report order (a new slice each call).
func Streams() []Stream { return []Stream{ComputeStream, AllGatherStream, ReduceScatterStream} }

// Event is one allocation or free of a step's timeline. A Free names the
// same Label, Layer, Micro and Bytes as the Alloc it releases.
type Event struct {
	Phase    Phase    `json:"phase"`
	Micro    int      `json:"micro"` // micro-step (gradient accumulation), 0-based; -1 for setup and optimizer
	Layer    int      `json:"layer"` // FSDP unit: moe.LayerEmbed, block index or the head's index
	Label    string   `json:"label"`
	Alloc    bool     `json:"alloc"` // false: free
	Bytes    int64    `json:"bytes"` // requested bytes, before allocator rounding
	Category Category `json:"category"`
	Stream   Stream   `json:"stream"`
}

// Delta is the change the event makes to the bytes live: +Bytes for an
// allocation, −Bytes for a free.
func (e Event) Delta() int64 {
	if e.Alloc {
		return e.Bytes
	}
	return -e.Bytes
}

func (e Event) String() string {
	verb := "free "
	if e.Alloc {
		verb = "alloc"
	}
	return fmt.Sprintf("%s m%d L%d %s %s %d B (%s, %s)", e.Phase, e.Micro, e.Layer, verb, e.Label, e.Bytes, e.Category, e.Stream)
}

// Peak is the result of replaying a timeline through the allocator model.
type Peak struct {
	Allocated int64 // max over events of live bytes (each request rounded to RoundBytes)
	Index     int   // event index at which Allocated is first reached (after applying it)
	// Reserved is the caching allocator's reserved bytes in steady state
	// (see Allocator.Simulate), times 1 + Fragmentation.
	Reserved int64
	// ReservedByStream is the simulated reserved bytes of each stream's pool.
	ReservedByStream map[Stream]int64
	// Live is the live bytes per category at the peak (rounded as Allocated).
	Live map[Category]int64
}

// Replay walks events in order, checks that every free matches a live
// allocation, and returns the peaks, reserved memory under the allocator's
// segment mode seg ("" is Expandable). It is the one definition of peak
// memory: the virtual-time backend calls it on the events it emits.
func Replay(events []Event, a Allocator, seg Segments) (Peak, error) {
	if err := a.Validate(); err != nil {
		return Peak{}, err
	}
	if seg == "" {
		seg = Expandable
	}
	if seg != Expandable && seg != Fixed {
		return Peak{}, fmt.Errorf("segments = %q: must be expandable or fixed", seg)
	}
	type key struct {
		label        string
		layer, micro int
	}
	live := make(map[key]int, liveHint(len(events))) // the live allocation's event index
	pairs := make([]int, len(events))
	var cur int64
	var p Peak
	p.Index = -1
	// Live bytes per category: the known ones in an array, snapshot at
	// each new peak (a map copied at every new peak was a tenth of a
	// replay), any other category in a map.
	var byCat, atPeak [numCategories]int64
	var other, otherAtPeak map[Category]int64
	for i, e := range events {
		if e.Bytes < 0 {
			return Peak{}, fmt.Errorf("event %d (%s): negative size", i, e)
		}
		switch e.Stream {
		case ComputeStream, AllGatherStream, ReduceScatterStream:
		default:
			return Peak{}, fmt.Errorf("event %d (%s): unknown stream %q", i, e, e.Stream)
		}
		k := key{e.Label, e.Layer, e.Micro}
		r := roundUp(max(e.Bytes, 1), a.RoundBytes)
		pairs[i] = -1
		if e.Alloc {
			// One map operation: the key was live already when storing it
			// leaves the map's size unchanged.
			n := len(live)
			if live[k] = i; len(live) == n {
				return Peak{}, fmt.Errorf("event %d (%s): allocated twice", i, e)
			}
			cur += r
			if c := categoryIndex(e.Category); c >= 0 {
				byCat[c] += r
			} else {
				if other == nil {
					other = map[Category]int64{}
				}
				other[e.Category] += r
			}
		} else {
			j, ok := live[k]
			if !ok || events[j].Bytes != e.Bytes {
				return Peak{}, fmt.Errorf("event %d (%s): frees nothing live of that size", i, e)
			}
			pairs[i] = j
			delete(live, k)
			cur -= r
			if c := categoryIndex(e.Category); c >= 0 {
				byCat[c] -= r
			} else {
				if other == nil {
					other = map[Category]int64{}
				}
				other[e.Category] -= r
			}
		}
		if cur > p.Allocated {
			p.Allocated = cur
			p.Index = i
			atPeak = byCat
			if other != nil {
				otherAtPeak = maps.Clone(other)
			}
		}
	}
	if p.Index >= 0 {
		p.Live = make(map[Category]int64, numCategories)
		for c, n := range atPeak {
			if n != 0 {
				p.Live[categories[c]] = n
			}
		}
		for c, n := range otherAtPeak {
			if n != 0 {
				p.Live[c] = n
			}
		}
	}
	p.ReservedByStream = a.simulate(events, pairs, seg)
	p.Reserved = p.ReservedWith(a.Fragmentation)
	return p, nil
}

// liveHint sizes the map of live allocations for n events: few are live
// at once, so a table for n/2 (a pipeline rank's hundreds of thousands)
// was mostly empty and its probes missed the cache; past the hint it
// grows as needed.
func liveHint(n int) int { return min(n/2, 4096) }

// ReservedWith is the peak reserved bytes with unmodelled fraction frag on
// top of the simulated pools: Σ ReservedByStream × (1 + frag). Replay
// reports it for its allocator's Fragmentation; a caller that varies only
// that fraction (calibration) replays once and asks again.
func (p Peak) ReservedWith(frag float64) int64 {
	var res int64
	for _, n := range p.ReservedByStream {
		res += n
	}
	return res + int64(float64(res)*frag)
}
