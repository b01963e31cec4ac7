package kernel

import (
	"runtime"
	"sync"
	"time"
)

// Peak is the measured float32 FMA throughput of this machine: the
// denominator of every CPU MFU moescope prints (never a GPU's peak).
//
// PerCoreGFLOPS is one thread running a register-only loop of independent
// vector FMAs (the widest this build can issue, Kernel), counting 2 FLOP per
// multiply-add lane; AllCoreGFLOPS is Threads such loops at once, total work
// over time. Time is each thread's own CPU time where the OS reports it
// (Linux), so other processes sharing the cores lower the figures little;
// elsewhere it is wall time. ClockGHz is measured with a chain of dependent 1-cycle
// integer adds (cpuid reports no frequency under most hypervisors); 0 when
// the build cannot measure it (purego). FLOPPerCycle = PerCoreGFLOPS /
// ClockGHz. Each figure is the best of several short runs, so a busy
// machine lowers it less than it lowers a single run.
type Peak struct {
	Kernel        string  `json:"kernel"`
	Threads       int     `json:"threads"`
	ClockGHz      float64 `json:"clock_ghz"`
	FLOPPerCycle  float64 `json:"flop_per_cycle"`
	PerCoreGFLOPS float64 `json:"peak_gflops_per_core"`
	AllCoreGFLOPS float64 `json:"peak_gflops"`
}

// peakRun is the length of one timed run and peakRepeats how many are taken.
// Short runs, many of them: on a shared machine some run finds both the
// core and the clock undisturbed.
const (
	peakRun     = 5 * time.Millisecond
	peakRepeats = 20
)

// MeasurePeak measures the FMA peak of the active micro-kernel for one core
// and for threads cores at once (threads ≤ 0 means GOMAXPROCS). It takes
// about 0.3 s.
func MeasurePeak(threads int) Peak {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	k := active()
	// Calibrate n so one run takes about peakRun.
	n := 1 << 10
	for {
		t := time.Now()
		k.fmaLoop(n)
		if d := time.Since(t); d > peakRun/4 || n > 1<<30 {
			n = int(float64(n) * float64(peakRun) / float64(max(d, time.Microsecond)))
			break
		}
		n *= 4
	}
	n = max(n, 1)
	flop := float64(n) * float64(k.loopFLOP)
	p := Peak{Kernel: k.name, Threads: threads}
	p.PerCoreGFLOPS = flop / bestOf(func() { k.fmaLoop(n) }) / 1e9
	// All cores: every thread's rate over its own time, summed; the best
	// of the repeats.
	rates := make([]float64, threads)
	for range peakRepeats {
		parallelLoop(threads, func(t int) { rates[t] = flop / timed(func() { k.fmaLoop(n) }) })
		var sum float64
		for _, r := range rates {
			sum += r
		}
		p.AllCoreGFLOPS = max(p.AllCoreGFLOPS, sum/1e9)
	}
	p.ClockGHz = measureClock()
	if p.ClockGHz > 0 {
		p.FLOPPerCycle = p.PerCoreGFLOPS / p.ClockGHz
	}
	return p
}

// bestOf returns the shortest time of f in seconds over peakRepeats runs
// on one locked OS thread.
func bestOf(f func()) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := 1e300
	for range peakRepeats {
		best = min(best, timed(f))
	}
	return best
}

// timed returns the seconds f takes: the calling thread's CPU time where
// available, else wall time. The caller has locked its OS thread.
func timed(f func()) float64 {
	if c0, ok := threadCPUTime(); ok {
		f()
		c1, _ := threadCPUTime()
		return max((c1 - c0).Seconds(), 1e-9)
	}
	t := time.Now()
	f()
	return max(time.Since(t).Seconds(), 1e-9)
}

// parallelLoop runs f(t) on threads goroutines t, each locked to an OS
// thread, released together.
func parallelLoop(threads int, f func(t int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(threads)
	for t := range threads {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			start.Wait()
			f(t)
			done.Done()
		}()
	}
	start.Done()
	done.Wait()
}
