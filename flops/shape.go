package flops

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Shape is the work of one step: Batch sequences of Seq tokens each.
type Shape struct {
	Seq   int // tokens per sequence, s
	Batch int // sequences, b
	// Act is the activations' storage type, which the memory budget's
	// knapsack weighs (moe.AC.Cached); "" is moe.DefaultPrecision's.
	Act moe.DType
}

// act is the activations' storage type.
func (s Shape) act() moe.DType {
	if s.Act == "" {
		return moe.DefaultPrecision.Activation
	}
	return s.Act
}

// maxShape bounds Seq and Batch (2^24); counts are overflow-checked anyway.
const maxShape = 1 << 24

// Validate names each out-of-range field.
func (s Shape) Validate() error {
	var errs []error
	if s.Seq < 1 || s.Seq > maxShape {
		errs = append(errs, fmt.Errorf("seq = %d: must be in [1, %d]", s.Seq, maxShape))
	}
	if s.Batch < 1 || s.Batch > maxShape {
		errs = append(errs, fmt.Errorf("batch = %d: must be in [1, %d]", s.Batch, maxShape))
	}
	return errors.Join(errs...)
}

// Tokens is T = Batch·Seq.
func (s Shape) Tokens() int64 { return int64(s.Batch) * int64(s.Seq) }

// Tile is a flash-attention block of Rows query rows by Cols key columns.
// Every tile holding at least one unmasked score is computed in full.
type Tile struct{ Rows, Cols int }

// ExactTile counts every unmasked score once (no tile waste): the model
// convention.
var ExactTile = Tile{1, 1}

// DefaultTile is a typical GPU flash-attention block (DESIGN: 128×128).
var DefaultTile = Tile{128, 128}

// Validate checks both sides are in [1, 2^24].
func (t Tile) Validate() error {
	if t.Rows < 1 || t.Cols < 1 || t.Rows > maxShape || t.Cols > maxShape {
		return fmt.Errorf("attention tile = %dx%d: both sides must be in [1, %d]", t.Rows, t.Cols, maxShape)
	}
	return nil
}

func (t Tile) String() string { return fmt.Sprintf("%dx%d", t.Rows, t.Cols) }
