// Package largest finds the largest local batch within a memory target
// from a memory estimate per candidate.
package largest

import (
	"math"

	"github.com/moescope/moescope/memory/verdict"
)

// Within is the one search for "the largest local batch within the
// memory target": the largest i in [1, n] whose memory fraction frac(i) is
// within target (verdict.WithinTarget), 0 when not even i = 1 is, and frac(1).
// frac must be non-decreasing in i (memory grows with the local batch); the
// probes choose only how fast the answer is found, never what it is. A
// caller maps its candidates (every local batch, or a pipeline's valid ones)
// to 1…n, and an estimate that cannot be made (an overflow) to +Inf.
//
// Memory is close to affine in the local batch (state + activations ∝ lbs),
// so the limit is first guessed from the slope between i = 1 and 2 and the
// guess and its neighbour checked (four evaluations when memory is
// affine); a guess past n, or none, probes the last two candidates and
// aims the line through them; any remaining bracket is closed by
// interpolation alternating with bisection.
func Within(n int, target float64, frac func(i int) (float64, error)) (int, float64, error) {
	fits := func(i int) (bool, float64, error) {
		m, err := frac(i)
		return err == nil && verdict.WithinTarget(m, target), m, err
	}
	ok, m1, err := fits(1)
	if err != nil || !ok || n == 1 {
		return map[bool]int{true: 1, false: 0}[ok && err == nil], m1, err
	}
	ok, m2, err := fits(2)
	if err != nil || !ok {
		return 1, m1, err
	}
	b := &bracket{lo: 2, hi: n + 1, mLo: m2, fits: fits}
	if slope := m2 - m1; slope > 0 {
		g := 2 + int((target-m2)/slope)
		if g >= b.hi && b.hi-1 > b.lo {
			// The line reaches the target beyond the last candidate:
			// try that one first.
			g = b.hi - 1
		}
		if err := b.probeNear(g); err != nil {
			return 0, m1, err
		}
	}
	// With no upper end known yet, the last candidate and the one before
	// are probed, and the line through them aimed at the target with its
	// neighbour checked: memory is near affine in the largest batches
	// (under a pipeline, once every stage holds its most micro-batches in
	// flight, where the slope from the first two batches is far too
	// steep), and a pipeline's largest batches are its costliest
	// estimates, which galloping towards them repeated.
	if b.hi == n+1 && b.hi-1 > b.lo {
		if err := b.probe(n); err != nil {
			return 0, m1, err
		}
		if mTop := b.mHi; b.hi == n && n-1 > b.lo {
			if err := b.probe(n - 1); err != nil {
				return 0, m1, err
			}
			if slope := mTop - b.mHi; b.hi == n-1 && slope > 0 {
				g := n - 1 - int(math.Ceil((b.mHi-target)/slope))
				if err := b.probeNear(g); err != nil {
					return 0, m1, err
				}
			}
		}
	}
	if err := b.close(target); err != nil {
		return 0, m1, err
	}
	return b.lo, m1, nil
}

// bracket is Within's search state: lo fits; hi does not, or is
// top+1 (nothing known above the last); mLo and mHi are their memory
// fractions once probed.
type bracket struct {
	lo, hi   int
	mLo, mHi float64
	fits     func(i int) (bool, float64, error)
}

// probe evaluates i and moves the end of the bracket it belongs to.
func (b *bracket) probe(i int) error {
	ok, m, err := b.fits(i)
	if ok {
		b.lo, b.mLo = i, m
	} else {
		b.hi, b.mHi = i, m
	}
	return err
}

// probeNear probes a guess g inside the bracket and then the neighbour on
// its far side, so that an exact guess closes the bracket.
func (b *bracket) probeNear(g int) error {
	if g <= b.lo || g >= b.hi {
		return nil
	}
	if err := b.probe(g); err != nil {
		return err
	}
	if b.lo == g && g+1 < b.hi {
		return b.probe(g + 1)
	} else if b.hi == g && g-1 > b.lo {
		return b.probe(g - 1)
	}
	return nil
}

// close closes what is left by the line through the bracket's ends aimed
// at target, every other step a bisection, so never in more than twice
// bisection's probes.
func (b *bracket) close(target float64) error {
	for step := 0; b.hi-b.lo > 1; step++ {
		mid := b.lo + (b.hi-b.lo)/2
		if step%2 == 0 && b.mHi > b.mLo {
			x := float64(b.lo) + (target-b.mLo)/(b.mHi-b.mLo)*float64(b.hi-b.lo)
			mid = min(max(int(x), b.lo+1), b.hi-1)
		}
		if err := b.probe(mid); err != nil {
			return err
		}
	}
	return nil
}
