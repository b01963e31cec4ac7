package scratch

import (
	"testing"
	"unsafe"
)

func same(a, b []float32) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

// TestGetZeroesReused checks a released buffer comes back, for a request of
// its length only, cleared as make's would be: the caller's writes are gone.
func TestGetZeroesReused(t *testing.T) {
	p := NewPool[float32]()
	l := p.Lease()
	n := 1 << 16 // past kernel.ParallelFor's threshold: cleared on every core
	a := l.Get(n)
	for i := range a {
		a[i] = 7
	}
	l.Release()
	if got := p.Free(); got != n {
		t.Fatalf("pool holds %d free elements after Release, want %d", got, n)
	}
	if b := l.Get(n - 1); same(a, b) {
		t.Fatal("a buffer of another length was handed out")
	}
	b := l.Get(n)
	if !same(a, b) {
		t.Fatal("the released buffer was not reused")
	}
	for i, v := range b {
		if v != 0 {
			t.Fatalf("reused buffer [%d] = %v, want 0", i, v)
		}
	}
	if got, want := l.Lent(), 2*n-1; got != want {
		t.Fatalf("lent %d elements, want %d", got, want)
	}
	// Made: the first Get of n and the Get of n−1; the second Get of n reused.
	if got := l.Made(); got != 2 {
		t.Fatalf("made %d buffers, want 2", got)
	}
}

// TestForget checks forgotten buffers never come back: someone may read them.
func TestForget(t *testing.T) {
	p := NewPool[float32]()
	l := p.Lease()
	a := l.Get(8)
	l.Forget()
	l.Release()
	if p.Free() != 0 || same(a, l.Get(8)) {
		t.Fatal("a forgotten buffer was handed out again")
	}
}

// held mimics a block's state: buffers in fields, nested structs, arrays,
// slices of slices and map values, some as sub-slices.
type held struct {
	x     []float32
	inner struct{ y []float32 }
	arr   [2][]float32
	rows  [][]float32
	cache map[string][]float32
	ptr   *[]float32
	n     int
}

// TestRetain checks Retain keeps exactly the lent buffers reachable
// without pointers from the roots and returns the rest.
func TestRetain(t *testing.T) {
	p := NewPool[float32]()
	l := p.Lease()
	bufs := make([][]float32, 8)
	for i := range bufs {
		bufs[i] = l.Get(10 + i) // distinct lengths: Free says which came back
	}
	behind := bufs[6]
	var h held
	h.x = bufs[0][3:5] // a sub-slice keeps its whole buffer
	h.inner.y = bufs[1]
	h.arr[1] = bufs[2]
	h.rows = [][]float32{nil, bufs[3]}
	h.cache = map[string][]float32{"k": bufs[4]}
	h.ptr = &behind // not followed: bufs[6] goes back
	other := bufs[5]
	l.Retain(&h, other)
	// Returned: bufs[6] (16 elements, behind a pointer) and bufs[7] (17, unheld).
	if got, want := p.Free(), 16+17; got != want {
		t.Fatalf("pool holds %d free elements, want %d", got, want)
	}
	if got, want := l.Lent(), 10+11+12+13+14+15; got != want {
		t.Fatalf("lease holds %d elements, want %d", got, want)
	}
	h = held{}
	l.Retain(&h)
	if got, want := p.Free(), 10+11+12+13+14+15+16+17; got != want {
		t.Fatalf("after dropping everything the pool holds %d, want %d", got, want)
	}
}
