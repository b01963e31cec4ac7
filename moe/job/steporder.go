package job

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// StepPass is the pass of a training step a phase belongs to.
type StepPass uint8

// The passes of a micro-step.
const (
	StepForward StepPass = iota
	StepBackward
)

func (p StepPass) String() string { return [...]string{"forward", "backward"}[p] }

// StepPhase is one unit's part in one pass of one micro-step: what happens
// to its gathered weights and its gradients around its compute. A unit is
// a layer (the embedding, a block with its experts, the head); backends
// that split a block into more FSDP units (its routed experts apart) apply
// the phase to each.
type StepPhase struct {
	Pass  StepPass
	Micro int
	Layer int
	// Gather: the unit's weights are not live when its compute starts
	// (first use in the step, or freed since) and are made so first: an
	// all-gather under FSDP, a cast copy where compute and storage types
	// differ; nothing where weights are always whole.
	Gather bool
	// Free: the unit's gathered weights are freed once its compute is
	// done (reshard-after-forward in forward, FSDP's reshard after
	// backward in backward).
	Free bool
	// Reduce (backward): the unit's gradients are reduced over the shard
	// axis in this micro-step; otherwise they are accumulated unreduced
	// (grad-sync-last-only before the last micro-step).
	Reduce bool
	// ReplicaReduce (backward): the reduced gradients are all-reduced over
	// dp_replicate in this micro-step (every one, or only the last under
	// allreduce-last-only).
	ReplicaReduce bool
}

func (p StepPhase) String() string {
	s := fmt.Sprintf("%d %s %d", p.Micro, p.Pass, p.Layer)
	for _, f := range []struct {
		on   bool
		name string
	}{{p.Gather, "gather"}, {p.Reduce, "reduce"}, {p.ReplicaReduce, "replica"}, {p.Free, "free"}} {
		if f.on {
			s += " " + f.name
		}
	}
	return s
}

// StepOrder is the order of one training step of a rank that holds the
// whole model (no pipeline), as data that the memory timeline, the
// schedule and the numeric ranks all walk: per micro-step the forward of
// every unit in order (embedding, blocks 0…L−1, head), then the backward
// in reverse; the optimizer follows the last micro-step. Every decision
// about when a unit's weights are gathered and freed and when its
// gradients are reduced is made here, once.
type StepOrder struct {
	Layers    []int // the units' layers, in forward order
	GradAccum int
	phases    []StepPhase // per micro-step: forward in order, then backward in reverse
	index     map[int]int // layer → position in Layers
}

// NewStepOrder builds the order of one step of cfg under layout l with
// accum micro-steps. The rules, FSDP2's as torchtitan applies them (pinned
// where parallel.BuildSchedule cites them):
//   - reshard after forward (FSDP, reshard-after-forward on): every block
//     but the last and the embedding, unless tied (the head reads its
//     weights); never the head (torchtitan's fully_shard of the last block
//     and the head passes reshard_after_forward False: backward starts
//     with them). Megatron's FSDP frees every block after its forward,
//     the last included, and its embedding and output layer, not FSDP
//     units, stay gathered (_post_forward release_module_parameters);
//   - free after backward: always (FSDP2 reshards after backward), but
//     with keep-gathered under FSDP only in the last micro-step, and never
//     Megatron's embedding and output layer;
//   - a unit's weights are gathered wherever they are not live;
//   - gradients are reduced every micro-step, or under
//     grad-sync-last-only only in the last; replicas all-reduce every
//     micro-step, or under allreduce-last-only only in the last.
func NewStepOrder(cfg *moe.Config, l Layout, accum int) StepOrder {
	o := StepOrder{GradAccum: accum, index: map[int]int{}}
	o.Layers = append(o.Layers, moe.LayerEmbed)
	for i := 0; i < cfg.Layers; i++ {
		o.Layers = append(o.Layers, i)
	}
	o.Layers = append(o.Layers, cfg.LayerHead())
	for i, layer := range o.Layers {
		o.index[layer] = i
	}
	live := make([]bool, len(o.Layers))
	for m := 0; m < accum; m++ {
		last := m == accum-1
		for i, layer := range o.Layers {
			p := StepPhase{Pass: StepForward, Micro: m, Layer: layer, Gather: !live[i], Free: reshardsAfterForward(cfg, l, layer)}
			live[i] = !p.Free
			o.phases = append(o.phases, p)
		}
		for i := len(o.Layers) - 1; i >= 0; i-- {
			layer := o.Layers[i]
			p := StepPhase{Pass: StepBackward, Micro: m, Layer: layer, Gather: !live[i], Free: freesAfterBackward(cfg, l, layer, last),
				Reduce: !l.GradSyncLastOnly || last, ReplicaReduce: l.DPReplicate > 1 && (!l.AllreduceLastOnly || last)}
			live[i] = !p.Free
			o.phases = append(o.phases, p)
		}
	}
	return o
}

// reshardsAfterForward is NewStepOrder's first rule.
func reshardsAfterForward(cfg *moe.Config, l Layout, layer int) bool {
	if l.Sharding != ShardFSDP || !l.ReshardAfterForward {
		return false
	}
	megatron := l.FSDPImpl == FSDPMegatron
	switch layer {
	case cfg.LayerHead():
		return false
	case moe.LayerEmbed:
		return !cfg.TiedEmbeddings && !megatron
	case cfg.Layers - 1:
		return megatron
	}
	return true
}

// freesAfterBackward is NewStepOrder's second rule; last says whether the
// micro-step is the step's last.
func freesAfterBackward(cfg *moe.Config, l Layout, layer int, last bool) bool {
	if l.Sharding != ShardFSDP {
		return true
	}
	if l.FSDPImpl == FSDPMegatron && (layer == moe.LayerEmbed || layer == cfg.LayerHead()) {
		return false
	}
	return !l.KeepGathered || last
}

// Phases is the whole step's phases in order.
func (o StepOrder) Phases() []StepPhase { return o.phases }

// Forward is micro-step m's forward phases, in unit order.
func (o StepOrder) Forward(m int) []StepPhase {
	n := len(o.Layers)
	return o.phases[2*n*m : 2*n*m+n]
}

// Backward is micro-step m's backward phases, in the order they run (the
// head first).
func (o StepOrder) Backward(m int) []StepPhase {
	n := len(o.Layers)
	return o.phases[2*n*m+n : 2*n*(m+1)]
}

// Phase is the phase of pass p of micro-step m for layer's unit.
func (o StepOrder) Phase(p StepPass, m, layer int) StepPhase {
	i := o.index[layer]
	if p == StepForward {
		return o.Forward(m)[i]
	}
	return o.Backward(m)[len(o.Layers)-1-i]
}

// Reduces reports whether micro-step m reduces gradients over the shard
// axis.
func (o StepOrder) Reduces(m int) bool { return o.Backward(m)[0].Reduce }

// KeepsPartial reports whether some micro-step reduces gradients over the
// shard axis but not over replicas, so that a partial reduction is kept
// until the replica all-reduce.
func (o StepOrder) KeepsPartial() bool {
	for m := 0; m < o.GradAccum; m++ {
		if b := o.Backward(m)[0]; b.Reduce && !b.ReplicaReduce && o.replicated() {
			return true
		}
	}
	return false
}

// replicated reports whether any micro-step all-reduces over replicas
// (dp_replicate > 1).
func (o StepOrder) replicated() bool {
	return o.Backward(o.GradAccum - 1)[0].ReplicaReduce
}

// KeptForward is the forward phases over layers whose weights stay
// gathered for the whole step, as a pipeline stage's do (FSDP does not
// reshard a stage's units; see parallel.BuildPipeline): nothing gathered
// or freed around the compute.
func KeptForward(layers []int) []StepPhase {
	ps := make([]StepPhase, len(layers))
	for i, l := range layers {
		ps[i] = StepPhase{Pass: StepForward, Layer: l}
	}
	return ps
}
