package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
	"golang.org/x/sync/errgroup"
)

// Comm connects the goroutine ranks of one mesh. Collectives are matched by
// (group, sequence number): the k-th collective a rank issues on a group
// meets the k-th of every other member. The last member to arrive checks
// that all agree on op, dtype and sizes, computes every member's result in
// a fixed order (so runs are reproducible bit for bit), records the bytes
// each member would move under NCCL's algorithms, and wakes the others.
//
// Failure handling: Run cancels every rank when one returns an error;
// disagreeing members get an error naming each rank's call; when every
// live rank waits in a collective that cannot complete (different groups,
// a rank that finished early) the wait is reported as a deadlock with each
// rank's pending call; a member that waits longer than Timeout fails with
// the ranks that arrived and those that did not; a rank that computes for
// Timeout/2 without finishing an op is stopped by the watchdog
// (StallError).
type Comm struct {
	mesh    *parallel.Mesh
	Timeout time.Duration // per collective wait; 0 means DefaultTimeout
	Stats   *Stats

	// Trace, when set before Run, keeps every rank's sequence of
	// collectives (see Traces).
	Trace bool

	mu      sync.Mutex
	traces  [][]Record
	slots   map[slotKey]*slot
	waiting []*slot // per rank: the slot it waits in, or nil
	exited  []bool
	start   time.Time      // of the current Run
	beats   []atomic.Int64 // per rank: time since start of its last progress, in ns (watchdog.go)
}

// DefaultTimeout bounds one collective wait.
const DefaultTimeout = 2 * time.Minute

// New makes the communicator of a mesh.
func New(m *parallel.Mesh) *Comm {
	return &Comm{mesh: m, Stats: NewStats(m.World()), slots: map[slotKey]*slot{},
		waiting: make([]*slot, m.World()), exited: make([]bool, m.World()), beats: make([]atomic.Int64, m.World())}
}

// Mesh returns the communicator's mesh.
func (c *Comm) Mesh() *parallel.Mesh { return c.mesh }

// Run starts one goroutine per rank running fn with that rank's endpoint and
// waits for all. The first error cancels ctx for every rank and is returned
// (errgroup semantics; context.Cause of a rank's ctx is that error); a rank
// the watchdog finds stalled cancels them with its StallError. Run returns
// only after every rank has returned.
func (c *Comm) Run(ctx context.Context, fn func(ctx context.Context, ep *Endpoint) error) error {
	c.mu.Lock()
	c.slots = map[slotKey]*slot{}
	c.traces = make([][]Record, c.mesh.World())
	c.start = time.Now()
	for r := range c.exited {
		c.exited[r], c.waiting[r] = false, nil
		c.beats[r].Store(0)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g, gctx := errgroup.WithContext(ctx)
	stop := make(chan struct{})
	var stall *StallError
	var watcher sync.WaitGroup
	watcher.Go(func() {
		if stall = c.watch(gctx, stop); stall != nil {
			cancel(stall)
		}
	})
	for r := 0; r < c.mesh.World(); r++ {
		ep := &Endpoint{c: c, rank: r, seq: map[string]uint64{}}
		g.Go(func() error {
			err := fn(gctx, ep)
			if err != nil {
				// Cancel before marking the rank finished: the ranks
				// waiting for it must see its failure as the cause, not
				// a deadlock (exit of a failed rank detects none).
				err = fmt.Errorf("rank %d: %w", r, err)
				cancel(err)
			}
			c.exit(r, err != nil)
			return err
		})
	}
	err := g.Wait()
	close(stop)
	watcher.Wait()
	if stall != nil && !errors.Is(err, stall) {
		// fn returned ctx.Err() without its cause: keep the diagnosis.
		err = errors.Join(stall, err)
	} else if cause := context.Cause(ctx); stall == nil && errors.Is(err, context.Canceled) && cause != nil && !errors.Is(cause, context.Canceled) {
		// A rank woken by the cancellation can return before the rank
		// whose failure caused it: the first failure is the cause.
		err = cause
	}
	return err
}

// Record is one collective as a rank issued it, sized as a schedule
// sizes it (ScheduleOp.Elements): the gathered output of an all-gather, the
// input of a reduce-scatter, the buffer of an all-reduce or broadcast, the
// rows sent × width of an all-to-all.
type Record struct {
	Kind     parallel.CollKind
	Axis     parallel.Axis
	DType    moe.DType
	Elements int64
}

// Traces returns every rank's collectives of the last Run (Trace set).
func (c *Comm) Traces() [][]Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.traces
}

// Endpoint is one rank's side of the communicator; it belongs to that rank's
// goroutine only.
type Endpoint struct {
	c    *Comm
	rank int
	seq  map[string]uint64
}

// Rank is the endpoint's global rank.
func (e *Endpoint) Rank() int { return e.rank }

// Comm returns the communicator.
func (e *Endpoint) Comm() *Comm { return e.c }

type slotKey struct {
	group string
	seq   uint64
}

// call is one member's side of a collective.
type call struct {
	rank   int
	kind   parallel.CollKind
	dtype  moe.DType
	size   int   // elements of in (per-member size for all-gather)
	root   int   // broadcast root, as a group index
	counts []int // all-to-all rows to each member
	width  int   // all-to-all row width
	add    bool  // reduce-scatter accumulates into out
	max    bool  // all-reduce takes the elementwise maximum instead of the sum

	in  []float32
	out []float32 // result written by the completing member

	recvCounts []int
}

func (cl *call) String() string {
	switch cl.kind {
	case parallel.CollAllToAll:
		return fmt.Sprintf("rank %d: %s %s rows %v × width %d", cl.rank, cl.kind, cl.dtype, cl.counts, cl.width)
	case parallel.CollBroadcast:
		return fmt.Sprintf("rank %d: %s %s × %d from member %d", cl.rank, cl.kind, cl.dtype, cl.size, cl.root)
	}
	return fmt.Sprintf("rank %d: %s %s × %d", cl.rank, cl.kind, cl.dtype, cl.size)
}

type slot struct {
	key     slotKey
	group   parallel.Group
	calls   []*call // by member index
	arrived int
	done    chan struct{}
	err     error
}

func (s *slot) describe() string {
	var parts []string
	for _, cl := range s.calls {
		if cl != nil {
			parts = append(parts, cl.String())
		}
	}
	return strings.Join(parts, "; ")
}

// Error reports a collective that failed on a group.
type Error struct {
	Group  string
	Seq    uint64
	Reason string // "mismatch", "deadlock", "timeout"
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("collective #%d on %s: %s: %s", e.Seq, e.Group, e.Reason, e.Detail)
}

// do joins collective cl on group g and waits for its completion.
func (e *Endpoint) do(ctx context.Context, g parallel.Group, cl *call) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	idx := g.IndexOf(e.rank)
	if idx < 0 {
		return fmt.Errorf("%s on %s: rank %d is not a member (%v)", cl.kind, g.Name(), e.rank, g.Ranks)
	}
	cl.rank = e.rank
	name := g.Name()
	if e.c.Trace {
		el := int64(cl.size)
		if cl.kind == parallel.CollAllGather {
			el *= int64(g.Size())
		}
		e.c.mu.Lock()
		e.c.traces[e.rank] = append(e.c.traces[e.rank], Record{Kind: cl.kind, Axis: g.Axis, DType: cl.dtype, Elements: el})
		e.c.mu.Unlock()
	}
	key := slotKey{name, e.seq[name]}
	e.seq[name]++
	c := e.c

	c.mu.Lock()
	s := c.slots[key]
	if s == nil {
		s = &slot{key: key, group: g, calls: make([]*call, g.Size()), done: make(chan struct{})}
		c.slots[key] = s
	}
	s.calls[idx] = cl
	s.arrived++
	if s.arrived == g.Size() {
		delete(c.slots, key)
		for _, r := range g.Ranks {
			if c.waiting[r] == s {
				c.waiting[r] = nil
			}
			c.beat(r) // leaving the collective is progress: the watchdog must not count its wait
		}
		c.mu.Unlock()
		s.err = c.complete(s)
		close(s.done)
		return s.err
	}
	c.waiting[e.rank] = s
	c.detectDeadlock()
	c.mu.Unlock()

	timeout := c.timeout()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		c.abandon(e.rank, s)
		return fmt.Errorf("%s on %s: %w", cl.kind, name, context.Cause(ctx))
	case <-t.C:
		c.mu.Lock()
		var in, out []int
		for i, x := range s.calls {
			if x != nil {
				in = append(in, g.Ranks[i])
			} else {
				out = append(out, g.Ranks[i])
			}
		}
		c.mu.Unlock()
		c.abandon(e.rank, s)
		return &Error{Group: name, Seq: key.seq, Reason: "timeout",
			Detail: fmt.Sprintf("%s waited %v; arrived ranks %v, missing ranks %v", cl.kind, timeout, in, out)}
	}
}

// abandon stops rank from waiting in s (it gave up).
func (c *Comm) abandon(rank int, s *slot) {
	c.mu.Lock()
	if c.waiting[rank] == s {
		c.waiting[rank] = nil
	}
	c.beat(rank) // it leaves with an error: not a stall
	c.mu.Unlock()
}

// exit marks rank as finished; ranks left waiting for it may be deadlocked,
// unless it failed: then the run is already cancelled with its error, which
// releases them.
func (c *Comm) exit(rank int, failed bool) {
	c.mu.Lock()
	c.exited[rank] = true
	c.waiting[rank] = nil
	if !failed {
		c.detectDeadlock()
	}
	c.mu.Unlock()
}

// detectDeadlock fails every pending slot when each live rank waits in an
// incomplete collective (nothing can make progress). c.mu is held.
func (c *Comm) detectDeadlock() {
	var stuck []int
	for r := range c.waiting {
		if c.exited[r] {
			continue
		}
		if c.waiting[r] == nil {
			return // rank r is still computing
		}
		stuck = append(stuck, r)
	}
	if len(stuck) == 0 {
		return
	}
	var lines []string
	seen := map[*slot]bool{}
	for _, r := range stuck {
		s := c.waiting[r]
		if seen[s] {
			continue
		}
		seen[s] = true
		var missing []int
		for i, x := range s.calls {
			if x == nil {
				missing = append(missing, s.group.Ranks[i])
			}
		}
		lines = append(lines, fmt.Sprintf("%s #%d has [%s], waiting for ranks %v", s.key.group, s.key.seq, s.describe(), missing))
	}
	var gone []int
	for r, x := range c.exited {
		if x {
			gone = append(gone, r)
		}
	}
	detail := strings.Join(lines, " | ")
	if len(gone) > 0 {
		detail += fmt.Sprintf(" | ranks %v have finished", gone)
	}
	for s := range seen {
		s.err = &Error{Group: s.key.group, Seq: s.key.seq, Reason: "deadlock (mismatched collectives)", Detail: detail}
		delete(c.slots, s.key)
		close(s.done)
	}
	for _, r := range stuck {
		c.waiting[r] = nil
		c.beat(r) // it leaves with the error: not a stall
	}
}

// AllGather returns the concatenation of every member's in, in group order;
// all members must give the same length.
func (e *Endpoint) AllGather(ctx context.Context, g parallel.Group, dt moe.DType, in []float32) ([]float32, error) {
	cl := &call{kind: parallel.CollAllGather, dtype: dt, size: len(in), in: in}
	if err := e.do(ctx, g, cl); err != nil {
		return nil, err
	}
	return cl.out, nil
}

// ReduceScatter sets out (len(in)/n elements) to the sum over members j, in
// group order, of chunk i of member j's in, where i is this rank's index:
// out = in_0[i] + in_1[i] + … evaluated left to right in float32.
func (e *Endpoint) ReduceScatter(ctx context.Context, g parallel.Group, dt moe.DType, in, out []float32) error {
	return e.reduceScatter(ctx, g, dt, in, out, false)
}

// ReduceScatterAdd is ReduceScatter accumulating into out:
// out = ((out + in_0[i]) + in_1[i]) + …, the order in which one rank would
// accumulate the same gradients micro-batch by micro-batch.
func (e *Endpoint) ReduceScatterAdd(ctx context.Context, g parallel.Group, dt moe.DType, in, out []float32) error {
	return e.reduceScatter(ctx, g, dt, in, out, true)
}

func (e *Endpoint) reduceScatter(ctx context.Context, g parallel.Group, dt moe.DType, in, out []float32, add bool) error {
	if n := g.Size(); len(in)%n != 0 || len(out) != len(in)/n {
		return fmt.Errorf("reduce_scatter on %s: input of %d elements does not split into %d chunks of len(out) = %d", g.Name(), len(in), n, len(out))
	}
	return e.do(ctx, g, &call{kind: parallel.CollReduceScatter, dtype: dt, size: len(in), in: in, out: out, add: add})
}

// AllReduce replaces buf on every member with buf_0 + buf_1 + … (group order,
// left to right in float32).
func (e *Endpoint) AllReduce(ctx context.Context, g parallel.Group, dt moe.DType, buf []float32) error {
	return e.do(ctx, g, &call{kind: parallel.CollAllReduce, dtype: dt, size: len(buf), in: buf})
}

// AllReduceMax replaces buf on every member with the elementwise maximum
// over the members (NCCL's ncclMax; loss parallel's maximum logit).
func (e *Endpoint) AllReduceMax(ctx context.Context, g parallel.Group, dt moe.DType, buf []float32) error {
	return e.do(ctx, g, &call{kind: parallel.CollAllReduce, dtype: dt, size: len(buf), in: buf, max: true})
}

// AllReduceAdd adds the sum of every member's in to out, left to right from
// out: out = ((out + in_0) + in_1) + …, the order in which one rank would
// accumulate the same gradients; in is left unchanged.
func (e *Endpoint) AllReduceAdd(ctx context.Context, g parallel.Group, dt moe.DType, in, out []float32) error {
	if len(out) != len(in) {
		return fmt.Errorf("all_reduce on %s: len(in) = %d ≠ len(out) = %d", g.Name(), len(in), len(out))
	}
	return e.do(ctx, g, &call{kind: parallel.CollAllReduce, dtype: dt, size: len(in), in: in, out: out})
}

// Broadcast copies member root's buf (root is a group index) into every
// member's buf.
func (e *Endpoint) Broadcast(ctx context.Context, g parallel.Group, dt moe.DType, root int, buf []float32) error {
	if root < 0 || root >= g.Size() {
		return fmt.Errorf("broadcast on %s: root %d not in [0, %d)", g.Name(), root, g.Size())
	}
	return e.do(ctx, g, &call{kind: parallel.CollBroadcast, dtype: dt, size: len(buf), root: root, in: buf})
}

// Barrier returns once every member has entered it.
func (e *Endpoint) Barrier(ctx context.Context, g parallel.Group) error {
	return e.do(ctx, g, &call{kind: parallel.CollBarrier, dtype: moe.F32})
}

// AllToAll sends rows of width elements: the first counts[0] rows of send to
// member 0, the next counts[1] to member 1, and so on. It returns the rows
// received, member 0's first, and how many came from each member. Counts may
// differ freely (uneven splits).
func (e *Endpoint) AllToAll(ctx context.Context, g parallel.Group, dt moe.DType, send []float32, counts []int, width int) ([]float32, []int, error) {
	total := 0
	for _, n := range counts {
		if n < 0 {
			return nil, nil, fmt.Errorf("all_to_all on %s: negative count in %v", g.Name(), counts)
		}
		total += n
	}
	if width < 1 || total*width != len(send) {
		return nil, nil, fmt.Errorf("all_to_all on %s: counts %v × width %d ≠ %d sent elements", g.Name(), counts, width, len(send))
	}
	cl := &call{kind: parallel.CollAllToAll, dtype: dt, size: len(send), counts: counts, width: width, in: send}
	if err := e.do(ctx, g, cl); err != nil {
		return nil, nil, err
	}
	return cl.out, cl.recvCounts, nil
}
