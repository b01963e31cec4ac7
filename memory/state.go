package memory

import (
	"fmt"
	"slices"
	"sync"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Unit is one FSDP unit as torchtitan wraps the model: the token embedding,
// each decoder block, and the head (final norm and LM head together). Its
// element counts are per rank.
type Unit struct {
	Layer int // moe.LayerEmbed, a block index, or cfg.LayerHead()
	// Local is the elements this rank computes with: every non-expert
	// parameter in full and its EP share (E/ep experts) of routed experts.
	// An all-gather produces Local elements at the compute dtype.
	Local int64
	// Shard is the elements this rank stores when the unit is sharded over
	// dp_shard (experts over dp_shard/ep), with FSDP2's padding: a tensor of
	// dim0 rows is cut into chunks of ⌈dim0/n⌉ rows (torch.chunk), and every
	// rank allocates a full chunk.
	Shard int64
	// Buffers are elements kept but not trained (the selection bias): stored
	// in fp32 on every rank, never sharded, no gradient or optimizer state.
	Buffers int64
	// Linear and Output are the Local elements of the weights of the linear
	// and output GEMM sets (job.GEMMSetOf), which an fp8 all-gather gathers
	// in fp8 when the recipe converts their set.
	Linear, Output int64
}

// Units lists the FSDP units of cfg under layout l, in forward order.
// Routed expert weights are stacked per layer and projection as torchtitan
// holds them ([E, out, in]), split over ep on dim 0, then sharded over
// efsdp = dp_shard/ep on dim 0, or on dim 1 when efsdp·ep > E (torchtitan's
// rule). Every other tensor is sharded on dim 0 over dp_shard.
//
// Under tensor parallelism a tensor is first cut over tp along its
// moe.Param.TP dimension (routed experts over Layout.ExpertTP, efsdp then
// being dp_shard·tp/(ep·etp)), each tp rank holding a ⌈n/tp⌉ chunk (the
// largest, as DTensor's uneven Shard gives rank 0), and FSDP shards that
// local tensor on its dim 0.
func Units(cfg *moe.Config, l job.Layout) ([]Unit, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if err := l.CheckModel(cfg); err != nil {
		return nil, err
	}
	key := unitsKey{cfg: fmt.Sprintf("%#v", *cfg), dpShard: l.DPShard, ep: l.EP, tp: l.TPDegree(), expertTP: l.ExpertTP()}
	if us, ok := unitsCache.Load(key); ok {
		return slices.Clone(us.([]Unit)), nil
	}
	// The parameter list depends on the config alone: a search meets
	// hundreds of (dp_shard, ep) pairs of one model, and listing it was
	// most of each miss. units only reads it.
	ps, ok := paramsCache.Load(key.cfg)
	if !ok {
		ps, _ = paramsCache.LoadOrStore(key.cfg, cfg.Params())
	}
	units := units(cfg, l, ps.([]moe.Param))
	unitsCache.Store(key, slices.Clone(units))
	return units, nil
}

// paramsCache memoizes moe.Config.Params by the config's whole content
// (unitsKey.cfg); one entry per model, never evicted.
var paramsCache sync.Map

// unitsCache memoizes Units by the config's whole content and the two
// layout fields Units reads: a planner sizes thousands of candidates of
// one model, and listing a large MoE's tensors (moe.Config.Params, tens of
// thousands of named entries) was a third of its time. Keys are few (one
// per model and dp_shard × ep), so it is never evicted.
var unitsCache sync.Map

type unitsKey struct {
	cfg                       string // fmt %#v of the config: every field, slices included
	dpShard, ep, tp, expertTP int
}

// units computes Units (the layout already checked) from cfg's params.
func units(cfg *moe.Config, l job.Layout, params []moe.Param) []Unit {
	head := cfg.LayerHead()
	units := make([]Unit, 0, cfg.Layers+2)
	index := map[int]int{}
	unitOf := func(layer int) *Unit {
		i, ok := index[layer]
		if !ok {
			i = len(units)
			index[layer] = i
			units = append(units, Unit{Layer: layer})
		}
		return &units[i]
	}
	unitOf(moe.LayerEmbed)
	for i := 0; i < cfg.Layers; i++ {
		unitOf(i)
	}
	unitOf(head)

	// Stacked routed-expert tensors, one per (layer, projection), in
	// Params order, with the rows and cols of one expert's slice. Every
	// expert of a layer has expert 0's shapes, so only expert 0 is read:
	// the others are most of Params' entries in large MoE models.
	type stack struct {
		layer      int
		rows, cols int64 // of one expert's slice on this rank (after the expert TP cut)
	}
	tp, xt := int64(l.TPDegree()), int64(l.ExpertTP())
	// cut is the tp rank's [rows, cols] of a [rows, cols] tensor placed by
	// split over n ranks.
	cut := func(split moe.TPSplit, rows, cols, n int64) (int64, int64) {
		switch split {
		case moe.TPDim0:
			return chunk(rows, n), cols
		case moe.TPDim1:
			return rows, chunk(cols, n)
		}
		return rows, cols
	}
	var stacks []stack
	for _, p := range params {
		layer := p.Layer
		if layer < 0 {
			if p.Group == moe.GroupEmbedding {
				layer = moe.LayerEmbed
			} else {
				layer = head
			}
		}
		u := unitOf(layer)
		if p.Buffer {
			u.Buffers += p.Elements()
			continue
		}
		rows := int64(p.Shape[0])
		rows, cols := cut(p.TP, rows, p.Elements()/rows, tp)
		if p.Group == moe.GroupRouted {
			if p.Expert == 0 {
				rows, cols = cut(p.TP, int64(p.Shape[0]), p.Elements()/int64(p.Shape[0]), xt)
				stacks = append(stacks, stack{layer, rows, cols})
			}
			continue
		}
		u.Local += rows * cols
		u.Shard += chunk(rows, int64(l.DPShard)) * cols
		switch set, _ := job.GEMMSetOf(p); set {
		case job.QuantLinear:
			u.Linear += rows * cols
		case job.QuantOutput:
			u.Output += rows * cols
		}
	}
	ep, efsdp := int64(l.EP), int64(l.ExpertShard())
	localE := int64(cfg.Experts) / ep
	for _, k := range stacks {
		u := unitOf(k.layer)
		u.Local += localE * k.rows * k.cols
		if efsdp*ep <= int64(cfg.Experts) {
			u.Shard += chunk(localE, efsdp) * k.rows * k.cols
		} else {
			u.Shard += localE * chunk(k.rows, efsdp) * k.cols
		}
	}
	return units
}

// chunk is torch.chunk's chunk size: ⌈n/k⌉.
func chunk(n, k int64) int64 { return (n + k - 1) / k }

// State is the training state one rank keeps for a whole step, in bytes.
type State struct {
	Params    int64 `json:"parameters"` // stored parameters (Param dtype) and fp32 buffers
	Grads     int64 `json:"gradients"`  // gradients (Grad dtype), present after the first backward
	Optimizer int64 `json:"optimizer"`  // AdamW's two moments, plus the master copy when the policy has one
}

// Total is Params + Grads + Optimizer.
func (s State) Total() int64 { return s.Params + s.Grads + s.Optimizer }

// StateOf sizes one rank's training state. What the dp_shard axis shards
// follows l.Sharding: fsdp shards parameters, gradients and optimizer state;
// zero2 gradients and optimizer state; zero1 optimizer state; ddp nothing.
// With moe.DefaultPrecision and fsdp this is (4 + 4 + 2·4)·Ψ_shard = 16·Ψ_shard
// bytes (Ψ_shard = Σ Unit.Shard), ZeRO-3's 16Ψ/N_d up to padding.
func StateOf(units []Unit, sharding job.Sharding, o Options) State {
	var local, shard, buffers int64
	for _, u := range units {
		local += u.Local
		shard += u.Shard
		buffers += u.Buffers
	}
	p, g, opt := local, local, shard
	switch sharding {
	case job.ShardFSDP:
		p, g = shard, shard
	case job.ShardZeRO2:
		g = shard
	case job.ShardDDP:
		opt = local
	}
	return State{
		Params:    p*o.Precision.Param.Bytes() + buffers*moe.F32.Bytes(),
		Grads:     g * o.Precision.Grad.Bytes(),
		Optimizer: opt * (2*o.Precision.Optimizer.Bytes() + o.Master.Bytes()),
	}
}

// checkPrecision rejects policies with an unknown storage type.
func checkPrecision(p moe.Precision, master moe.DType) error {
	for _, f := range []struct {
		name string
		t    moe.DType
	}{{"param", p.Param}, {"compute", p.Compute}, {"grad", p.Grad}, {"optimizer", p.Optimizer}, {"activation", p.Activation}} {
		switch f.t {
		case moe.F32, moe.BF16, moe.F16:
		default:
			return fmt.Errorf("precision.%s = %q: must be f32, bf16 or f16", f.name, f.t)
		}
	}
	switch master {
	case "", moe.F32, moe.BF16, moe.F16:
	default:
		return fmt.Errorf("master = %q: must be empty, f32, bf16 or f16", master)
	}
	return nil
}
