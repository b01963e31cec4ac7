package parallel

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// StagePass is one pipeline micro-batch's forward (backward false) or
// backward through stage s of p as BuildSchedule emits the same layers for
// one micro-step of pp_microbatch_size sequences on the stage's layout:
// the compute segments, the expert-parallel all-to-alls and the
// tensor-parallel collectives (StageTPCollectives' list, in its order),
// with the same dependencies. Under async TP each all-gather and
// reduce-scatter is its exposed first chunk and its overlapped part
// (tpColl), the computation waiting for the overlapped part one segment
// later; the last collectives' overlapped parts have no segment after them
// in the pass, which ends when they do (the stage's output, or its input's
// gradient, is what they produce). A backward holds each fully
// checkpointed block's recompute before its backward. Left out: the FSDP
// collectives and the replicated gradients' all-reduce, which the pipeline
// program issues once per stage and micro-step (BuildPipeline). Op ids are
// the pass's own, from 0.
func (p *Pipeline) StagePass(cfg *moe.Config, s, seq int, ac moe.AC, prec moe.Precision, backward bool) ([]ScheduleOp, error) {
	if cfg == nil {
		return nil, errors.New("stage pass: config is required")
	}
	if s < 0 || s >= len(p.Split) {
		return nil, fmt.Errorf("stage pass: stage %d: must be in [0, %d)", s, len(p.Split))
	}
	if seq < 1 {
		return nil, fmt.Errorf("stage pass: seq = %d: must be ≥ 1", seq)
	}
	if prec == (moe.Precision{}) {
		prec = moe.DefaultPrecision
	}
	l := p.Stage.Layout
	mbs := p.Layout.PPMicrobatchSize
	b := &schedBuilder{sp: ScheduleSpec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: mbs, Seq: seq, GradAccum: 1}}, Mesh: p.Stage, NoMemory: true},
		cfg: cfg, paramIx: NewUnitIndex(cfg), m: p.Stage, l: l, prec: prec, s: &Schedule{Layout: l, AC: ac, LBS: mbs, Seq: seq, GradAccum: 1},
		pass: true}
	b.reset()
	first, count := p.StageLayers(s)
	last := s == len(p.Split)-1
	if l.TPDegree() > 1 {
		b.tp = map[int][]TPColl{}
		for _, layer := range p.stageLayerIDs(cfg, s) {
			b.tp[layer] = TPCollectives(cfg, l, layer, mbs*seq, ac, prec.Activation)
		}
	}
	if !backward {
		if s == 0 {
			b.compute(0, moe.LayerEmbed, PhaseForward, SegEmbed)
		}
		for layer := first; layer < first+count; layer++ {
			b.forwardBlock(0, layer, PhaseForward)
		}
		if last {
			b.compute(0, cfg.LayerHead(), PhaseForward, SegHead)
		}
		return b.s.Ops, nil
	}
	if last {
		b.compute(0, cfg.LayerHead(), PhaseBackward, SegHead)
	}
	for layer := first + count - 1; layer >= first; layer-- {
		b.backwardBlock(0, layer, func(Unit, int) {})
	}
	if s == 0 {
		b.compute(0, moe.LayerEmbed, PhaseBackward, SegEmbed)
	}
	return b.s.Ops, nil
}
