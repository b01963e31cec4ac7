package memory

import "fmt"

// Allocator models PyTorch's CUDA caching allocator: how the bytes of live
// tensors (allocated) become bytes held from the device (reserved). Its
// parameters are data, so calibration can replace them.
//
// Simulate replays a step's events through the allocator's policy as
// c10/cuda/CUDACachingAllocator.cpp implements it (PyTorch 2.x, default
// settings; Fixed segments):
//   - a request is rounded up to a multiple of RoundBytes (kMinBlockSize, 512);
//   - requests of at most SmallBytes (kSmallSize, 1 MiB) use the small pool,
//     larger ones the large pool; each stream has its own pools, and a
//     block freed on one stream serves only that stream;
//   - a request takes the smallest cached free block of its pool that fits
//     (best fit), split when the remainder is at least RoundBytes (small
//     pool) or more than SmallBytes (large pool);
//   - otherwise a new segment is reserved: SmallSegmentBytes (kSmallBuffer,
//     2 MiB) for small requests, LargeSegmentBytes (kLargeBuffer, 20 MiB)
//     for requests below MinLargeAllocBytes (kMinLargeAlloc, 10 MiB), and
//     the request rounded up to RoundLargeBytes (kRoundLarge, 2 MiB) above;
//   - a freed block merges with free neighbours of its segment; segments
//     are never released (no empty_cache), so reserved only grows.
//
// With expandable segments (PYTORCH_ALLOC_CONF=expandable_segments:True;
// the Note and find_expandable_block / map_block /
// try_allocate_expandable_block of the same file) each stream's pool is
// one segment of reserved virtual addresses that is mapped page by page
// (pages of SmallSegmentBytes in the small pool, LargeSegmentBytes in the
// large one). Best fit among free blocks is unchanged; a request no free
// block fits is served at the segment's end, taking the free block there if
// the end is free and mapping only the shortfall, rounded up to pages. So a
// freed block at the end grows in place instead of leaving a hole that a
// larger request cannot use.
//
// Reserved memory is measured in steady state: the setup events once, then
// the step's events twice (the second step starts from the first step's
// cache, as every step of a run after the first does).
//
// Fragmentation is a fraction added on top for what the simulation does not
// see (allocations outside the timeline such as cuBLAS workspaces, and
// tensors the timeline lumps together); it is the parameter calibration fits.
type Allocator struct {
	RoundBytes         int64   // every request rounds up to a multiple of this
	SmallBytes         int64   // requests up to this use the small pool
	SmallSegmentBytes  int64   // segment size of the small pool
	LargeSegmentBytes  int64   // segment size for large requests below MinLargeAllocBytes
	MinLargeAllocBytes int64   // large requests from this size get their own rounded segment
	RoundLargeBytes    int64   // rounding of such segments
	Fragmentation      float64 // extra fraction of the simulated reserved bytes
	// Source says where the numbers come from.
	Source string
}

// DefaultAllocator is PyTorch's policy with a 2% allowance for unmodelled
// allocations. The constants are kMinBlockSize, kSmallSize, kSmallBuffer,
// kLargeBuffer, kMinLargeAlloc and kRoundLarge of
// c10/cuda/CUDACachingAllocator.cpp. The 2% is an uncalibrated assumption
// (`moescope calibrate` fits it to measurements).
var DefaultAllocator = Allocator{
	RoundBytes:         512,
	SmallBytes:         1 << 20,
	SmallSegmentBytes:  2 << 20,
	LargeSegmentBytes:  20 << 20,
	MinLargeAllocBytes: 10 << 20,
	RoundLargeBytes:    2 << 20,
	Fragmentation:      0.02,
	Source:             "PyTorch c10/cuda/CUDACachingAllocator.cpp block policy, simulated; +2% unmodelled (assumed, to calibrate)",
}

// Validate checks the parameters.
func (a Allocator) Validate() error {
	if a.RoundBytes < 1 || a.SmallBytes < a.RoundBytes || a.SmallSegmentBytes < a.SmallBytes ||
		a.RoundLargeBytes < a.RoundBytes || a.LargeSegmentBytes < a.MinLargeAllocBytes || a.MinLargeAllocBytes < a.SmallBytes {
		return fmt.Errorf("allocator: round %d, small %d, small segment %d, large segment %d, min large alloc %d, round large %d: "+
			"need 1 ≤ round ≤ small ≤ small segment, small ≤ min large alloc ≤ large segment, round large ≥ round",
			a.RoundBytes, a.SmallBytes, a.SmallSegmentBytes, a.LargeSegmentBytes, a.MinLargeAllocBytes, a.RoundLargeBytes)
	}
	if !(a.Fragmentation >= 0 && a.Fragmentation < 1) {
		return fmt.Errorf("allocator: fragmentation = %v: must be in [0, 1)", a.Fragmentation)
	}
	return nil
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// Round is the size of the block a request of n bytes asks for.
func (a Allocator) Round(n int64) int64 { return roundUp(max(n, 1), a.RoundBytes) }

// SegmentSize is what a new segment for a request of r (rounded) bytes reserves.
func (a Allocator) SegmentSize(r int64) int64 {
	switch {
	case r <= a.SmallBytes:
		return a.SmallSegmentBytes
	case r < a.MinLargeAllocBytes:
		return a.LargeSegmentBytes
	}
	return roundUp(r, a.RoundLargeBytes)
}

// simBlock is a block of a segment; blocks of a segment are linked in
// address order.
type simBlock struct {
	seg        int // segment id, for deterministic tie-breaking
	off, size  int64
	free       bool
	at         int // index in its pool's free list while free
	prev, next *simBlock
	pool       *simPool
}

type simPool struct {
	free []*simBlock
	// tail is the last block of the pool's expandable segment (nil until
	// its first mapping); Fixed segments do not use it.
	tail *simBlock
}

// add puts free block b on p's free list.
func (p *simPool) add(b *simBlock) {
	b.at = len(p.free)
	p.free = append(p.free, b)
}

// remove takes b off p's free list by moving the last entry into its
// place: the list's order does not matter, since bestFit's order (size,
// segment, offset) is total over a pool's blocks.
func (p *simPool) remove(b *simBlock) {
	last := p.free[len(p.free)-1]
	p.free[b.at] = last
	last.at = b.at
	p.free = p.free[:len(p.free)-1]
}

// bestFit returns the smallest free block of at least r bytes (ties: lowest
// segment, lowest offset), or nil.
func (p *simPool) bestFit(r int64) *simBlock {
	var best *simBlock
	for _, b := range p.free {
		if b.size < r {
			continue
		}
		if best == nil || b.size < best.size || (b.size == best.size && (b.seg < best.seg || (b.seg == best.seg && b.off < best.off))) {
			best = b
		}
	}
	return best
}

// allocSim is one replay. Frees find their block through pairs (event
// index of the allocation each free releases) rather than by label, and
// pools are indexed by stream and size class: the replay runs for every
// layout a planner sizes.
type allocSim struct {
	a          Allocator
	expandable bool
	pools      [2 * numStreams]*simPool
	blocks     []*simBlock // by allocation event index: its live block
	pairs      []int       // by free event index: its allocation's index (-1: none)
	reserved   [numStreams]int64
	segs       int
	// spare holds blocks a merge discarded, reused by later splits: a
	// replay splits and merges thousands of blocks, and allocating each
	// anew was half of a memory estimate's allocations.
	spare []*simBlock
}

// newBlock returns a block to fill, reusing a discarded one when there is one.
func (s *allocSim) newBlock() *simBlock {
	if n := len(s.spare); n > 0 {
		x := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return x
	}
	return new(simBlock)
}

const numStreams = 3

// streamIndex numbers the streams of Streams (others are refused by Replay).
func streamIndex(st Stream) int {
	switch st {
	case AllGatherStream:
		return 1
	case ReduceScatterStream:
		return 2
	}
	return 0
}

func (s *allocSim) pool(st Stream, small bool) *simPool {
	k := 2 * streamIndex(st)
	if small {
		k++
	}
	if s.pools[k] == nil {
		s.pools[k] = &simPool{}
	}
	return s.pools[k]
}

// pairEvents returns, for each free event, the index of the allocation it
// releases (label, layer and micro-step match), -1 for allocations and
// for frees of nothing live.
func pairEvents(events []Event) []int {
	type key struct {
		label        string
		layer, micro int
	}
	live := make(map[key]int, liveHint(len(events)))
	pairs := make([]int, len(events))
	for i, e := range events {
		k := key{e.Label, e.Layer, e.Micro}
		pairs[i] = -1
		if e.Alloc {
			live[k] = i
		} else if j, ok := live[k]; ok {
			pairs[i] = j
			delete(live, k)
		}
	}
	return pairs
}

func (s *allocSim) alloc(i int, e Event) {
	r := s.a.Round(e.Bytes)
	small := r <= s.a.SmallBytes
	p := s.pool(e.Stream, small)
	b := p.bestFit(r)
	switch {
	case b != nil:
	case s.expandable:
		b = s.grow(p, e.Stream, r, small)
	default:
		size := s.a.SegmentSize(r)
		s.segs++
		b = &simBlock{seg: s.segs, size: size, free: true, pool: p}
		p.add(b)
		s.reserved[streamIndex(e.Stream)] += size
	}
	p.remove(b)
	b.free = false
	rest := b.size - r
	if (small && rest >= s.a.RoundBytes) || (!small && rest > s.a.SmallBytes) {
		n := s.newBlock()
		*n = simBlock{seg: b.seg, off: b.off + r, size: rest, free: true, prev: b, next: b.next, pool: p}
		if b.next != nil {
			b.next.prev = n
		}
		b.next = n
		b.size = r
		p.add(n)
		if p.tail == b {
			p.tail = n
		}
	}
	s.blocks[i] = b
}

// grow maps pages at the end of pool p's expandable segment until its last
// block is free and holds r bytes, and returns that block (still in the
// free list).
func (s *allocSim) grow(p *simPool, st Stream, r int64, small bool) *simBlock {
	page := s.a.LargeSegmentBytes
	if small {
		page = s.a.SmallSegmentBytes
	}
	t := p.tail
	if t == nil || !t.free {
		var off int64
		if t != nil {
			off = t.off + t.size
		}
		n := &simBlock{seg: 0, off: off, free: true, prev: t, pool: p}
		if t != nil {
			t.next = n
		}
		p.add(n)
		p.tail, t = n, n
	}
	mapped := roundUp(r-t.size, page)
	t.size += mapped
	s.reserved[streamIndex(st)] += mapped
	return t
}

func (s *allocSim) release(i int) {
	j := s.pairs[i]
	if j < 0 || s.blocks[j] == nil {
		return // Replay reports unbalanced timelines
	}
	b := s.blocks[j]
	s.blocks[j] = nil
	p := b.pool
	b.free = true
	if n := b.next; n != nil && n.free {
		p.remove(n)
		b.size += n.size
		b.next = n.next
		if n.next != nil {
			n.next.prev = b
		}
		if p.tail == n {
			p.tail = b
		}
		s.spare = append(s.spare, n)
	}
	if q := b.prev; q != nil && q.free {
		p.remove(q)
		q.size += b.size
		q.next = b.next
		if b.next != nil {
			b.next.prev = q
		}
		if p.tail == b {
			p.tail = q
		}
		s.spare = append(s.spare, b)
		b = q
	}
	p.add(b)
}

// Simulate replays events (setup once, then the rest twice) under segment
// mode seg and returns the reserved bytes of each stream's pools at the
// end, which for a never-releasing cache is their peak.
func (a Allocator) Simulate(events []Event, seg Segments) map[Stream]int64 {
	return a.simulate(events, pairEvents(events), seg)
}

// simulate is Simulate with the events' pairs already found.
func (a Allocator) simulate(events []Event, pairs []int, seg Segments) map[Stream]int64 {
	s := &allocSim{a: a, expandable: seg != Fixed, blocks: make([]*simBlock, len(events)), pairs: pairs}
	apply := func(i int, e Event) {
		if e.Alloc {
			s.alloc(i, e)
		} else {
			s.release(i)
		}
	}
	for i, e := range events {
		if e.Phase == Setup {
			apply(i, e)
		}
	}
	for pass := 0; pass < 2; pass++ {
		for i, e := range events {
			if e.Phase != Setup {
				apply(i, e)
			}
		}
	}
	out := make(map[Stream]int64, numStreams)
	for _, st := range Streams() {
		if n := s.reserved[streamIndex(st)]; n > 0 {
			out[st] = n
		}
	}
	return out
}
