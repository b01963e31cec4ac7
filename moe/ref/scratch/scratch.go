// Package scratch recycles the large buffers of a repeated computation: a
// training step's activations and gradients, allocated afresh on every
// step, cost the runtime a clear of every byte on one core and, once the
// collector has handed the memory back, a page fault per page. A Pool keeps
// the buffers a step returned, by length, for the next step to take.
//
// A user draws a Lease on a pool, gets its buffers from the lease and,
// when none of them is read any more, releases them (Release) or hands
// back those no live structure points into (Retain). Whatever escapes the
// user must not come from a lease: the pool hands it out again.
package scratch

import (
	"reflect"

	"github.com/moescope/moescope/moe/kernel"
)

// Pool holds free buffers by length, for the leases drawn on it. The zero
// value is not ready: use NewPool. A pool and its leases are not safe for
// concurrent use.
type Pool[T any] struct {
	free map[int][][]T // len → free buffers of that length
}

// NewPool returns an empty pool.
func NewPool[T any]() *Pool[T] { return &Pool[T]{free: map[int][][]T{}} }

// Lease returns a new, empty lease on p.
func (p *Pool[T]) Lease() *Lease[T] { return &Lease[T]{pool: p} }

// Free is the number of elements p holds free.
func (p *Pool[T]) Free() int {
	n := 0
	for l, bufs := range p.free {
		n += l * len(bufs)
	}
	return n
}

func (p *Pool[T]) put(s []T) { p.free[len(s)] = append(p.free[len(s)], s) }

// take returns a free buffer of n elements, or nil.
func (p *Pool[T]) take(n int) []T {
	bufs := p.free[n]
	if len(bufs) == 0 {
		return nil
	}
	s := bufs[len(bufs)-1]
	bufs[len(bufs)-1] = nil
	p.free[n] = bufs[:len(bufs)-1]
	return s
}

// Lease is one user's account with a pool: the buffers lent to it.
type Lease[T any] struct {
	pool *Pool[T]
	lent [][]T
	made int // Gets the pool had no free buffer for
}

// Get returns n zeroed elements, as make([]T, n) does: a free buffer of
// that length cleared on every core (kernel.ParallelFor), or a new one.
func (l *Lease[T]) Get(n int) []T {
	s := l.pool.take(n)
	if s == nil {
		s = make([]T, n)
		l.made++
	} else {
		kernel.ParallelFor(len(s), 1, func(lo, hi int) { clear(s[lo:hi]) })
	}
	l.lent = append(l.lent, s)
	return s
}

// Made is how many of l's Gets found no free buffer of their length and
// made one.
func (l *Lease[T]) Made() int { return l.made }

// Lent is the number of elements lent to l.
func (l *Lease[T]) Lent() int {
	n := 0
	for _, s := range l.lent {
		n += len(s)
	}
	return n
}

// Release returns every buffer lent to l to the pool: none may be read or
// written after.
func (l *Lease[T]) Release() {
	for i, s := range l.lent {
		l.pool.put(s)
		l.lent[i] = nil
	}
	l.lent = l.lent[:0]
}

// Forget drops l's buffers without returning them (someone may still read
// them): the collector frees them when nothing does.
func (l *Lease[T]) Forget() { l.lent = nil }

// Retain returns to the pool every buffer lent to l that no []T reachable
// from roots points into, and keeps the others lent. Reachable means
// through struct fields, arrays, slices and map values, starting from each
// root (a pointer root is followed once; pointers inside are not).
func (l *Lease[T]) Retain(roots ...any) {
	var live []span
	for _, r := range roots {
		v := reflect.ValueOf(r)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		live = spans[T](v, live)
	}
	kept := l.lent[:0]
	for _, s := range l.lent {
		if overlaps(spanOf(s), live) {
			kept = append(kept, s)
		} else {
			l.pool.put(s)
		}
	}
	clear(l.lent[len(kept):])
	l.lent = kept
}
