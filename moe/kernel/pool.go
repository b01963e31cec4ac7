package kernel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// arena is one worker's scratch: packed panels and an edge tile, grown to
// the largest size seen and then reused, so steady-state calls allocate
// nothing.
type arena struct {
	ap, bp []float32
	tile   []float32   // one mr×nr edge tile
	f      [][]float32 // kernel-specific scratch (attention tiles), by slot
}

// grow returns s resized to n elements, reallocating only when it is too
// small.
func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// scratch returns slot i of the arena's extra buffers with n elements.
func (ar *arena) scratch(i, n int) []float32 {
	for len(ar.f) <= i {
		ar.f = append(ar.f, nil)
	}
	ar.f[i] = grow(ar.f[i], n)
	return ar.f[i]
}

// arenas hands arenas to callers that run on their own goroutine.
var arenas = sync.Pool{New: func() any { return new(arena) }}

// pool is the set of worker goroutines that parallel kernels fan out to. One
// parallel call holds it at a time; a call that finds it busy (another
// goroutine's kernel, e.g. a simulated rank) runs on its own goroutine
// alone, so concurrent callers share the cores instead of queueing.
type pool struct {
	mu      sync.Mutex // held by the call that owns the workers
	threads atomic.Int32
	workers []chan job // one per worker goroutine, len = threads−1
	done    sync.WaitGroup
	next    atomic.Int64 // the owning call's task counter
	// own is the owning call's arena, kept here rather than drawn from
	// arenas: a sync.Pool is emptied by every other collection and keeps
	// what a goroutine put on its core's private slot, so a large arena
	// (attention's backward scratch, tens of MB a step) was regrown
	// whenever the caller moved cores or the collector ran.
	own arena
}

// tasker is a parallel call's work: task(ar, t) for t in [0, tasks). Callers
// pass a pointer taken from a sync.Pool, so a call allocates nothing.
type tasker interface {
	task(ar *arena, t int)
}

// job is one parallel call as a worker sees it: claim task indices from next
// until they run out.
type job struct {
	tasks int
	next  *atomic.Int64
	f     tasker
}

var workers pool

func init() { workers.threads.Store(int32(runtime.GOMAXPROCS(0))) }

// SetThreads sets how many cores parallel kernels use (n ≤ 0: GOMAXPROCS)
// and returns the previous setting. It must not be called while kernels run.
func SetThreads(n int) int {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return int(workers.threads.Swap(int32(n)))
}

// Threads returns how many cores parallel kernels use.
func Threads() int { return int(workers.threads.Load()) }

// parallel runs f(ar, t) for every t in [0, tasks) on up to Threads()
// goroutines, each with its own arena, and returns when all are done.
func parallel(tasks int, f tasker) {
	n := min(Threads(), tasks)
	if n <= 1 || !workers.mu.TryLock() {
		ar := arenas.Get().(*arena)
		for t := range tasks {
			f.task(ar, t)
		}
		arenas.Put(ar)
		return
	}
	defer workers.mu.Unlock()
	for len(workers.workers) < n-1 {
		ch := make(chan job)
		workers.workers = append(workers.workers, ch)
		go worker(ch)
	}
	workers.next.Store(0)
	j := job{tasks: tasks, next: &workers.next, f: f}
	workers.done.Add(n - 1)
	for _, ch := range workers.workers[:n-1] {
		ch <- j
	}
	j.run(&workers.own)
	workers.done.Wait()
}

func (j job) run(ar *arena) {
	for {
		t := int(j.next.Add(1) - 1)
		if t >= j.tasks {
			return
		}
		j.f.task(ar, t)
	}
}

// worker serves jobs with its own arena for the life of the process.
func worker(ch chan job) {
	ar := new(arena)
	for j := range ch {
		j.run(ar)
		workers.done.Done()
	}
}
