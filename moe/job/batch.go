package job

import (
	"errors"

	"github.com/moescope/moescope/moe"
)

// Batch is the data one data-parallel rank processes per optimizer step
// (DESIGN's Batch contract): GradAccum micro-steps of LBS sequences of Seq
// tokens each. The global batch is LBS × dp_replicate × dp_shard ×
// GradAccum sequences (Global).
type Batch struct {
	LBS       int `json:"lbs"`                  // sequences per data-parallel rank per micro-step
	Seq       int `json:"seq"`                  // tokens per sequence
	GradAccum int `json:"grad_accum,omitempty"` // micro-steps per optimizer step (absent in JSON = 1)
}

// The one set of batch limits every command and package checks (Validate).
//   - MaxLBS, MaxSeq: 2^24 sequences, 2^24 tokens (16.7M): far above any
//     local batch that fits a device and above the longest published
//     context (Llama 4 Scout's 10M tokens).
//   - MaxTokens: lbs·seq ≤ 2^32 tokens per micro-step, so that every byte
//     count (tokens × at most two model widths × a dtype size) stays far
//     from overflowing int64; memory's own overflow check bounds the rest.
//   - MaxGradAccum: 2^16 micro-steps per optimizer step: the schedule and
//     the memory timeline hold every micro-step's ops, so a larger count
//     exhausts the host before it answers (2^20 asked 28 GB of train).
const (
	MaxLBS       = 1 << 24
	MaxSeq       = 1 << 24
	MaxTokens    = 1 << 32
	MaxGradAccum = 1 << 16
)

// Accum is the micro-steps per optimizer step, GradAccum with 0 read as 1.
func (b Batch) Accum() int { return max(b.GradAccum, 1) }

// Tokens is T = LBS·Seq, the tokens of one rank's micro-step.
func (b Batch) Tokens() int64 { return int64(b.LBS) * int64(b.Seq) }

// Global is the sequences one optimizer step consumes over dp
// data-parallel ranks (dp_replicate × dp_shard; pipeline stages share
// them).
func (b Batch) Global(dp int) int64 { return int64(b.LBS) * int64(dp) * int64(b.Accum()) }

// Validate names every field out of its range.
func (b Batch) Validate() error {
	var errs []error
	if b.LBS < 1 || b.LBS > MaxLBS {
		errs = append(errs, moe.FieldError{Field: "lbs", Value: b.LBS, Allowed: "must be in [1, 16777216]"})
	}
	if b.Seq < 1 || b.Seq > MaxSeq {
		errs = append(errs, moe.FieldError{Field: "seq", Value: b.Seq, Allowed: "must be in [1, 16777216]"})
	}
	if b.GradAccum < 1 || b.GradAccum > MaxGradAccum {
		errs = append(errs, moe.FieldError{Field: "grad_accum", Value: b.GradAccum, Allowed: "must be in [1, 65536]"})
	}
	if len(errs) == 0 && b.Tokens() > MaxTokens {
		errs = append(errs, moe.FieldError{Field: "lbs × seq", Value: b.Tokens(), Allowed: "must be at most 4294967296 tokens per micro-step"})
	}
	return errors.Join(errs...)
}
