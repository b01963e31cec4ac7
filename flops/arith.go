package flops

import (
	"errors"
	"math"
	"math/bits"
)

// ErrOverflow is returned (wrapped) when a count does not fit in int64.
var ErrOverflow = errors.New("count overflows int64 (reduce seq, batch or model size)")

// checked accumulates the first error of a chain of int64 operations on
// non-negative values; once failed, every further result is 0.
type checked struct{ err error }

func (c *checked) mul(xs ...int64) int64 {
	r := int64(1)
	for _, x := range xs {
		if c.err != nil {
			return 0
		}
		if x < 0 {
			c.err = errors.New("flops: negative factor")
			return 0
		}
		hi, lo := bits.Mul64(uint64(r), uint64(x))
		if hi != 0 || lo > math.MaxInt64 {
			c.err = ErrOverflow
			return 0
		}
		r = int64(lo)
	}
	return r
}

func (c *checked) add(xs ...int64) int64 {
	var r int64
	for _, x := range xs {
		if c.err != nil {
			return 0
		}
		if x < 0 {
			c.err = errors.New("flops: negative term")
			return 0
		}
		if r > math.MaxInt64-x {
			c.err = ErrOverflow
			return 0
		}
		r += x
	}
	return r
}
