package plan

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
)

// planStandIn is an analytic stand-in evaluator for testing the planner's
// search logic only: a few closed forms with the right monotonic shapes
// (memory grows with lbs and shrinks with sharding; compute efficiency grows
// with lbs; FSDP traffic slows down once the shard group leaves the host;
// expert all-to-all and replica all-reduce cost bandwidth). Its numbers are
// not predictions; the real evaluator is the virtual-time backend.
type planStandIn struct {
	denseParams, expertParams float64 // parameters (elements)
	activeParams              float64 // parameters a token touches
	layers, hidden, vocab     float64
	topK                      float64
	seq                       float64
	capacityBytes             float64
	peakFLOPs                 float64
	nvlinkBps, nicBps         float64 // bytes/s per GPU inside / outside a host
}

// planStandInModel returns a stand-in shaped like an MoE of the given total
// parameters (billions) with 1/10 of the parameters active.
func planStandInModel(totalB float64, layers, hidden int) *planStandIn {
	return &planStandIn{
		denseParams: totalB * 1e9 * 0.05, expertParams: totalB * 1e9 * 0.95,
		activeParams: totalB * 1e9 * 0.1,
		layers:       float64(layers), hidden: float64(hidden), vocab: 151936, topK: 8,
		seq: 4096, capacityBytes: 178.35 * (1 << 30), peakFLOPs: 2.25e15,
		nvlinkBps: 900e9, nicBps: 50e9,
	}
}

func (m *planStandIn) perGPUParams(l job.Layout) float64 {
	return m.denseParams + m.expertParams/float64(l.EP)
}

func (m *planStandIn) MemoryFraction(p Point) (float64, error) {
	l := p.Layout
	if err := l.Validate(); err != nil {
		return 0, err
	}
	n := m.perGPUParams(l)
	s := float64(l.DPShard)
	var state float64 // bytes: fp32 params 4, bf16 compute 2, fp32 grads 4, Adam 8
	switch l.Sharding {
	case job.ShardFSDP:
		state = 16 * (m.denseParams + m.expertParams) / s // experts: ep × dp_shard/ep = dp_shard ways
		if !l.ReshardAfterForward || l.KeepGathered {
			state += 2 * n
		} else {
			state += 2 * 2 * n / m.layers
		}
	case job.ShardZeRO2:
		state = 6*n + 12*n/s
	case job.ShardZeRO1:
		state = 10*n + 8*n/s
	default:
		state = 18 * n
	}
	tokens := float64(p.LBS) * m.seq
	perTokenLayer := map[moe.ACMode]float64{moe.ACNone: 60, moe.ACSelective: 30, moe.ACFull: 2}[p.AC.Mode]
	act := tokens * m.hidden * m.layers * perTokenLayer
	if p.AC.Mode == moe.ACFull {
		act += tokens * m.hidden * 60 // one block's activations during recompute
	}
	logits := tokens * m.vocab * 4 * 2
	return (state + act + logits) * 1.05 / m.capacityBytes, nil
}

func (m *planStandIn) Evaluate(p Point) (Score, error) {
	mem, err := m.MemoryFraction(p)
	if err != nil {
		return Score{}, err
	}
	l := p.Layout
	perNode := l.GPUsPerNode
	if perNode == 0 {
		perNode = 8
	}
	tokens := float64(p.LBS) * m.seq
	eff := 0.6 * tokens / (tokens + 8192)
	recompute := map[moe.ACMode]float64{moe.ACNone: 0, moe.ACSelective: 0.12, moe.ACFull: 0.33}[p.AC.Mode]
	compute := 6 * m.activeParams * tokens * (1 + recompute) / (m.peakFLOPs * eff)
	bw := func(group int) float64 {
		if group <= perNode {
			return m.nvlinkBps
		}
		return m.nicBps
	}
	n := m.perGPUParams(l)
	s := float64(l.DPShard)
	var fsdp float64 // seconds of parameter/gradient traffic per micro-step
	if l.Sharding == job.ShardFSDP && l.DPShard > 1 {
		gathers := 2.0
		if !l.ReshardAfterForward {
			gathers = 1
		}
		fsdp = (gathers*2*n + 4*n) * (s - 1) / s / bw(l.DPShard)
	} else if l.DPShard > 1 {
		fsdp = 4 * n * (s - 1) / s / bw(l.DPShard)
	}
	a2a := 0.0
	if l.EP > 1 {
		e := float64(l.EP)
		a2a = 4 * m.layers * tokens * m.topK * m.hidden * 2 * (e - 1) / e / bw(l.EP)
	}
	ar := 0.0
	if l.DPReplicate > 1 {
		r := float64(l.DPReplicate)
		group := l.DPReplicate * l.DPShard // replicas sit on different hosts once dp_shard fills one
		ar = 2 * 4 * n / s * (r - 1) / r / bw(group)
	}
	ga := float64(p.GradAccum)
	micro := compute + math.Max(0, fsdp-0.7*compute) + a2a
	step := ga * micro
	if l.KeepGathered && ga > 1 {
		step -= (ga - 1) * math.Max(0, fsdp*0.3-0.7*compute)
	}
	if l.AllreduceLastOnly {
		step += ar
	} else {
		step += ga * ar
	}
	step += 16 * n / s / 8e12 // optimizer over the shard at HBM speed
	tps := tokens * ga / step
	bott := "compute"
	if a2a > compute/2 {
		bott = "all-to-all"
	} else if fsdp > 0.7*compute {
		bott = "fsdp"
	}
	return Score{TPS: tps, MFU: 6 * m.activeParams * tps / m.peakFLOPs, MemoryFraction: mem, StepTimeS: step,
		Bottleneck: bott, Breakdown: sim.Breakdown{ComputeS: ga * compute, ExposedCommS: map[string]float64{"fsdp": step - ga*compute}}}, nil
}

// String names the stand-in in test logs.
func (m *planStandIn) String() string {
	return fmt.Sprintf("stand-in %.0fB", (m.denseParams+m.expertParams)/1e9)
}
