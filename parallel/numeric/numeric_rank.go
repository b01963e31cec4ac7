package numeric

import (
	"context"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// numUnit is one rank's state of one FSDP unit. Its tensors (FSDPShard
// geometry over the unit's shard group) are stored flat: data, grad, m
// and v concatenate the per-tensor pieces, each piece the tensor's shard
// (ShardElements) or the whole tensor (Elements) as the sharding mode says.
type numUnit struct {
	u      parallel.Unit
	group  parallel.Group // the shard group (dp_shard or efsdp)
	idx    int            // this rank's index in group
	shards []parallel.FSDPShard
	// params[k] lists the Config.Params indices tensor k is made of: one
	// for a dense tensor, the local experts' tensors (stacked) for experts.
	params [][]int

	fullData, shardGrad, shardOpt bool // what is stored whole (data) or sharded (grad, opt)

	data, grad, m, v []float32

	full  [][]float32 // gathered (or full) weights per tensor while live, else nil
	ugrad [][]float32 // this micro-step's unsharded gradients per tensor
	// acc holds, per tensor, the unsharded gradients summed over the
	// micro-steps so far under grad-sync-last-only (nil otherwise).
	acc [][]float32
}

// numRank is one goroutine rank.
type numRank struct {
	spec  *Spec
	order job.StepOrder // this step's (trainStep), which the rank walks
	cfg   *moe.Config
	rank  int
	coord parallel.Coord
	units []*numUnit
	byKey map[parallel.Unit]*numUnit

	scratch *ref.Model[float32] // views the block runners read weights from and write gradients to
	blocks  []*ref.Block[float32]
	embed   *ref.Embedding[float32]
	headRun *ref.Head[float32]
	stage   *epStage
	tp      *tpComm      // nil without tensor parallelism
	cp      *cpAttention // nil without context parallelism

	optStep int64
	mem     memAccount
	rec     *rankRecorder
	fault   *Fault    // see Trainer.SetFault
	counts  [][][]int // this step's per-expert counts [micro][layer][expert]
	// loads is the last step's global routed rows per [layer][expert]
	// that moved the selection biases (nil without them).
	loads [][]int64
}

// expertParamIndex returns, per projection (gate, up, down), the Params
// indices of the routed experts [lo, hi) of layer l.
func expertParamIndex(cfg *moe.Config, l, lo, hi int) [3][]int {
	var out [3][]int
	k := 0
	for i, p := range cfg.Params() {
		if p.Group != moe.GroupRouted || p.Layer != l || p.Expert < lo || p.Expert >= hi {
			continue
		}
		out[k%3] = append(out[k%3], i) // Params lists gate, up, down per expert
		k++
	}
	return out
}

func newNumRank(spec *Spec, rank int, init [][]float32) (*numRank, error) {
	cfg, m := spec.Model, spec.Mesh
	// Under tensor parallelism the scratch views and the block runners
	// have the rank's local shapes (TPLocal; the same tensors in the same
	// order as cfg's).
	lcfg := cfg
	if tp := m.Layout.TPDegree(); tp > 1 {
		lcfg = ref.TPLocal(cfg, tp, m.Layout.ExpertTP())
	}
	sc, err := ref.NewModel[float32](lcfg)
	if err != nil {
		return nil, err
	}
	r := &numRank{spec: spec, cfg: cfg, rank: rank, coord: m.Coord(rank), byKey: map[parallel.Unit]*numUnit{}, scratch: sc}
	// Buffers (the selection bias) are replicated and live in the scratch model.
	for i, p := range cfg.Params() {
		if p.Buffer {
			copy(sc.Tensors()[i], init[i])
		}
	}
	sh := m.Layout.Sharding
	units := []parallel.Unit{{Layer: moe.LayerEmbed}}
	for l := 0; l < cfg.Layers; l++ {
		units = append(units, parallel.Unit{Layer: l})
		if cfg.MoELayer[l] {
			units = append(units, parallel.Unit{Layer: l, Experts: true})
		}
	}
	units = append(units, parallel.Unit{Layer: cfg.LayerHead()})
	ux := parallel.NewUnitIndex(cfg)
	ps := cfg.Params()
	for _, u := range units {
		axis := parallel.AxisShard
		if u.Experts {
			axis = parallel.AxisEFSDP
		}
		g := m.Group(axis, rank)
		nu := &numUnit{u: u, group: g, idx: g.IndexOf(rank), shards: parallel.UnitTensors(cfg, ux, m, u, g.Size())}
		nu.fullData = sh != job.ShardFSDP
		nu.shardGrad = sh == job.ShardFSDP || sh == job.ShardZeRO2
		nu.shardOpt = sh != job.ShardDDP
		if u.Experts {
			el := cfg.Experts / m.Layout.EP
			lo := r.coord.EP * el
			ix := expertParamIndex(cfg, u.Layer, lo, lo+el)
			nu.params = [][]int{ix[0], ix[1], ix[2]}
		} else {
			for _, i := range ux.ByLayer[u.Layer] {
				nu.params = append(nu.params, []int{i})
			}
		}
		for k, s := range nu.shards {
			full := make([]float32, 0, s.Elements())
			for _, i := range nu.params[k] {
				full = append(full, r.tpPiece(ps[i], init[i])...)
			}
			if nu.fullData {
				nu.data = append(nu.data, full...)
			} else {
				nu.data = append(nu.data, s.Shard(full, nu.idx)...)
			}
		}
		nu.grad = make([]float32, nu.size(nu.shardGrad))
		nu.m = make([]float32, nu.size(nu.shardOpt))
		nu.v = make([]float32, nu.size(nu.shardOpt))
		r.units = append(r.units, nu)
		r.byKey[u] = nu
	}
	r.rec = &rankRecorder{mem: &r.mem}
	o := spec.withNumerics(ref.Options{AC: spec.AC, Recorder: r.rec, Precision: spec.storage, AuxCoef: spec.AuxCoef})
	if g := m.Group(parallel.AxisTP, rank); g.Size() > 1 {
		r.tp = newTPComm(g, rank, spec.data(), cfg, m.Layout, spec.storage, spec.AC)
	}
	if m.Layout.EP > 1 {
		r.stage = &epStage{cfg: lcfg, dtype: spec.storage.Activation, rec: r.rec, ac: spec.AC, saved: map[int]*epSaved{},
			weights: r.expertWeights, grads: r.expertGrads}
	}
	r.embed = ref.NewEmbedding[float32](lcfg, o)
	r.headRun = ref.NewHead[float32](lcfg, o)
	r.cp = newCPAttention(m, rank, spec)
	for l := 0; l < cfg.Layers; l++ {
		b := ref.NewBlock[float32](lcfg, l, spec.Batch.LBS, spec.Batch.Seq/spec.CP.degree(), o)
		if r.stage != nil && cfg.MoELayer[l] {
			b.Experts = r.stage
		}
		r.cp.attach(b)
		r.blocks = append(r.blocks, b)
	}
	r.mem.alloc(r.stateBytes())
	return r, nil
}

// size is the flat length of the unit's tensors, sharded or whole.
func (u *numUnit) size(sharded bool) int {
	n := 0
	for _, s := range u.shards {
		if sharded {
			n += int(s.ShardElements())
		} else {
			n += int(s.Elements())
		}
	}
	return n
}

// pieces splits flat (sharded or whole) into per-tensor views.
func (u *numUnit) pieces(flat []float32, sharded bool) [][]float32 {
	out := make([][]float32, len(u.shards))
	off := 0
	for k, s := range u.shards {
		n := int(s.Elements())
		if sharded {
			n = int(s.ShardElements())
		}
		out[k] = flat[off : off+n : off+n]
		off += n
	}
	return out
}

// paddedIn lays whole per-tensor buffers out as a reduce-scatter input
// [member][tensor shard], so chunk j is member j's flat shard.
func (u *numUnit) paddedIn(whole [][]float32) []float32 {
	out := make([]float32, 0, u.size(true)*u.group.Size())
	for j := 0; j < u.group.Size(); j++ {
		for k, s := range u.shards {
			out = append(out, s.Shard(whole[k], j)...)
		}
	}
	return out
}

// unshardFlat turns an all-gather output [member][flat shard] into whole
// per-tensor buffers.
func (u *numUnit) unshardFlat(gathered []float32) [][]float32 {
	n := u.group.Size()
	per := u.size(true)
	out := make([][]float32, len(u.shards))
	off := 0
	for k, s := range u.shards {
		se := int(s.ShardElements())
		g := make([]float32, 0, se*n)
		for j := 0; j < n; j++ {
			g = append(g, gathered[j*per+off:j*per+off+se]...)
		}
		out[k] = make([]float32, s.Elements())
		s.Unshard(g, out[k])
		off += se
	}
	return out
}

// stateBytes is the persistent training state at the modelled dtypes:
// parameters as this rank stores them (shard or whole) and the replicated
// fp32 buffers, accumulated gradients, and two AdamW moments.
func (r *numRank) stateBytes() int64 {
	p := r.spec.storage
	var b int64
	for _, u := range r.units {
		b += int64(len(u.data))*p.Param.Bytes() + int64(len(u.grad))*p.Grad.Bytes() + 2*int64(len(u.m))*p.Optimizer.Bytes()
	}
	for _, q := range r.cfg.Params() {
		if q.Buffer {
			b += q.Elements() * moe.F32.Bytes()
		}
	}
	return b
}

// gather makes u's whole weights live (an all-gather of the compute dtype
// under fsdp) and installs them where the block runners read them.
func (r *numRank) gather(ctx context.Context, ep *collective.Endpoint, u *numUnit) error {
	if u.full != nil {
		return nil
	}
	switch {
	case u.fullData: // the whole parameters are here; installed until the optimizer changes them
		u.full = u.pieces(u.data, false)
	case u.group.Size() == 1:
		u.full = u.pieces(u.data, true) // one member: the shard is the whole tensor
	default:
		g, err := ep.AllGather(ctx, u.group, r.spec.storage.Compute, u.data)
		if err != nil {
			return err
		}
		u.full = u.unshardFlat(g)
		r.mem.alloc(r.gatheredBytes(u))
	}
	r.install(u)
	return nil
}

func (r *numRank) gatheredBytes(u *numUnit) int64 {
	var n int64
	for _, s := range u.shards {
		n += s.PaddedElements()
	}
	return n * r.spec.storage.Compute.Bytes()
}

// release frees u's gathered weights (fsdp with a real gather only).
func (r *numRank) release(u *numUnit) {
	if u.full == nil || u.fullData {
		return
	}
	if u.group.Size() > 1 {
		r.mem.free(r.gatheredBytes(u))
	}
	u.full = nil
}

// install copies whole weights into the scratch model's views (expert
// stacks split per expert), where ref.Block reads them.
func (r *numRank) install(u *numUnit) {
	ts := r.scratch.Tensors()
	for k, ix := range u.params {
		if len(ix) == 1 {
			copy(ts[ix[0]], u.full[k])
			continue
		}
		per := len(u.full[k]) / len(ix)
		for j, i := range ix {
			copy(ts[i], u.full[k][j*per:(j+1)*per])
		}
	}
}

// zeroGrads clears the scratch gradient views of u before its backward.
func (r *numRank) zeroGrads(u *numUnit) {
	gs := r.scratch.Grads()
	for _, ix := range u.params {
		for _, i := range ix {
			clear(gs[i])
		}
	}
}

// takeGrads copies u's micro-step gradients out of the scratch views.
func (r *numRank) takeGrads(u *numUnit) [][]float32 {
	gs := r.scratch.Grads()
	out := make([][]float32, len(u.params))
	for k, ix := range u.params {
		for _, i := range ix {
			out[k] = append(out[k], gs[i]...)
		}
	}
	return out
}

// expertWeights returns the whole weights of layer l's local experts (the
// EP stage's view), per local expert.
func (r *numRank) expertWeights(l int) (gate, up, down [][]float32) {
	u := r.byKey[parallel.Unit{Layer: l, Experts: true}]
	ts := r.scratch.Tensors()
	pick := func(ix []int) [][]float32 {
		out := make([][]float32, len(ix))
		for j, i := range ix {
			out[j] = ts[i]
		}
		return out
	}
	return pick(u.params[0]), pick(u.params[1]), pick(u.params[2])
}

// expertGrads returns the gradient accumulators of layer l's local experts.
func (r *numRank) expertGrads(l int) (gate, up, down [][]float32) {
	u := r.byKey[parallel.Unit{Layer: l, Experts: true}]
	gs := r.scratch.Grads()
	pick := func(ix []int) [][]float32 {
		out := make([][]float32, len(ix))
		for j, i := range ix {
			out[j] = gs[i]
		}
		return out
	}
	return pick(u.params[0]), pick(u.params[1]), pick(u.params[2])
}

// addLocal is acc += in, elementwise (a reduction over a one-member group).
func addLocal(acc, in []float32) {
	for i, x := range in {
		acc[i] += x
	}
}

// reduce reduces u's micro-step gradients (whole, per tensor) into its
// accumulated gradient, as the type comment of Trainer describes.
func (r *numRank) reduce(ctx context.Context, ep *collective.Endpoint, u *numUnit, g [][]float32, micro int) error {
	l := r.spec.Mesh.Layout
	if l.GradSyncLastOnly && r.spec.Batch.GradAccum > 1 {
		var last bool
		if g, last = r.accumulate(u, g, micro); !last {
			return nil
		}
	}
	if err := r.tpReduceReplicated(ctx, ep, u, g); err != nil {
		return err
	}
	dt := r.spec.storage.Grad
	n := u.group.Size()
	var in []float32
	if u.shardGrad {
		in = u.paddedIn(g)
	} else {
		for _, t := range g {
			in = append(in, t...)
		}
	}
	rep := ep.Comm().Mesh().Group(parallel.AxisReplicate, r.rank)
	perMicro := rep.Size() > 1 && !l.AllreduceLastOnly
	acc := u.grad
	if perMicro {
		acc = make([]float32, len(u.grad))
	}
	switch {
	case n == 1:
		addLocal(acc, in)
	case u.shardGrad:
		if err := ep.ReduceScatterAdd(ctx, u.group, dt, in, acc); err != nil {
			return err
		}
	default:
		if err := ep.AllReduceAdd(ctx, u.group, dt, in, acc); err != nil {
			return err
		}
	}
	switch {
	case perMicro:
		if err := ep.AllReduce(ctx, rep, dt, acc); err != nil {
			return err
		}
		addLocal(u.grad, acc)
	case rep.Size() > 1 && micro == r.spec.Batch.GradAccum-1:
		if err := ep.AllReduce(ctx, rep, dt, u.grad); err != nil {
			return err
		}
	}
	return nil
}

// accumulate adds u's micro-step gradients g into its unsharded
// accumulator (grad-sync-last-only: no collective before the last
// micro-step) and, in the last micro-step, hands the sums back to be
// reduced once: the reduction of a sum is the sum of the reductions.
func (r *numRank) accumulate(u *numUnit, g [][]float32, micro int) ([][]float32, bool) {
	var n int64
	for _, t := range g {
		n += int64(len(t))
	}
	by := n * r.spec.storage.Grad.Bytes()
	if u.acc == nil {
		u.acc = make([][]float32, len(g))
		for k, t := range g {
			u.acc[k] = append([]float32(nil), t...)
		}
		r.mem.alloc(by)
	} else {
		for k, t := range g {
			addLocal(u.acc[k], t)
		}
	}
	if micro < r.spec.Batch.GradAccum-1 {
		return nil, false
	}
	acc := u.acc
	u.acc = nil
	r.mem.free(by)
	return acc, true
}

// optimize applies AdamW to the rank's share and, under zero1/zero2,
// all-gathers the updated shards.
func (r *numRank) optimize(ctx context.Context, ep *collective.Endpoint) error {
	r.optStep++
	a := r.spec.AdamW
	for _, u := range r.units {
		switch {
		case !u.shardOpt: // ddp: whole
			st := ref.AdamState[float32]{Step: r.optStep - 1, M: u.m, V: u.v}
			ref.AdamWStep(a, &st, u.data, u.grad)
		case !u.fullData: // fsdp: data and grad sharded alike
			st := ref.AdamState[float32]{Step: r.optStep - 1, M: u.m, V: u.v}
			ref.AdamWStep(a, &st, u.data, u.grad)
		default: // zero1, zero2: update this rank's shard of the whole parameters
			whole := u.pieces(u.data, false)
			var p, g []float32
			for k, s := range u.shards {
				p = append(p, s.Shard(whole[k], u.idx)...)
			}
			if u.shardGrad {
				g = u.grad
			} else {
				gw := u.pieces(u.grad, false)
				for k, s := range u.shards {
					g = append(g, s.Shard(gw[k], u.idx)...)
				}
			}
			st := ref.AdamState[float32]{Step: r.optStep - 1, M: u.m, V: u.v}
			ref.AdamWStep(a, &st, p, g)
			if u.group.Size() == 1 {
				copy(u.data, p)
				break
			}
			gathered, err := ep.AllGather(ctx, u.group, r.spec.storage.Param, p)
			if err != nil {
				return err
			}
			off := 0
			for k, t := range u.unshardFlat(gathered) {
				copy(u.data[off:], t)
				off += len(whole[k])
			}
		}
		clear(u.grad)
		if u.fullData {
			u.full = nil // reinstall the updated parameters at the next gather
		}
	}
	return nil
}

// collectFull writes the rank's share of the whole parameters into out
// (Params order), allocating tensors on first touch.
func (r *numRank) collectFull(out [][]float32) {
	ps := r.cfg.Params()
	for _, u := range r.units {
		for k, s := range u.shards {
			var whole []float32
			if u.fullData {
				whole = u.pieces(u.data, false)[k]
			} else {
				whole = make([]float32, s.Elements())
				// Place this rank's rows only (the others come from their owners).
				piece := u.pieces(u.data, true)[k]
				tmp := make([]float32, s.PaddedElements())
				copy(tmp[u.idx*int(s.ShardElements()):], piece)
				s.Unshard(tmp, whole)
			}
			per := len(whole) / len(u.params[k])
			for j, i := range u.params[k] {
				if out[i] == nil {
					out[i] = make([]float32, ps[i].Elements())
				}
				// Add when sharded: every other rank contributes zeros at
				// this rank's rows. Each tp rank places its own piece.
				n, idx := r.tpSplit(ps[i])
				ref.TPUnshard(ps[i], whole[j*per:(j+1)*per], out[i], n, idx, !u.fullData)
			}
		}
	}
}

// collectBuffers copies the replicated buffers into out.
func (r *numRank) collectBuffers(out [][]float32) {
	ts := r.scratch.Tensors()
	for i, p := range r.cfg.Params() {
		if p.Buffer {
			out[i] = append([]float32(nil), ts[i]...)
		}
	}
}

// collectMoments writes the rank's share of the AdamW moments into m, v.
func (r *numRank) collectMoments(m, v [][]float32) {
	ps := r.cfg.Params()
	for _, u := range r.units {
		for k, s := range u.shards {
			for _, pair := range [2]struct {
				src []float32
				dst [][]float32
			}{{u.m, m}, {u.v, v}} {
				whole := make([]float32, s.Elements())
				if u.shardOpt {
					piece := u.pieces(pair.src, true)[k]
					tmp := make([]float32, s.PaddedElements())
					copy(tmp[u.idx*int(s.ShardElements()):], piece)
					s.Unshard(tmp, whole)
				} else {
					copy(whole, u.pieces(pair.src, false)[k])
				}
				per := len(whole) / len(u.params[k])
				for j, i := range u.params[k] {
					if pair.dst[i] == nil {
						pair.dst[i] = make([]float32, ps[i].Elements())
					}
					n, idx := r.tpSplit(ps[i])
					ref.TPUnshard(ps[i], whole[j*per:(j+1)*per], pair.dst[i], n, idx, u.shardOpt)
				}
			}
		}
	}
}

// loadMoments places the rank's share of whole moments m, v.
func (r *numRank) loadMoments(m, v [][]float32) {
	ps := r.cfg.Params()
	for _, u := range r.units {
		var fm, fv []float32
		for k, s := range u.shards {
			wm, wv := make([]float32, 0, s.Elements()), make([]float32, 0, s.Elements())
			for _, i := range u.params[k] {
				wm = append(wm, r.tpPiece(ps[i], m[i])...)
				wv = append(wv, r.tpPiece(ps[i], v[i])...)
			}
			if u.shardOpt {
				fm = append(fm, s.Shard(wm, u.idx)...)
				fv = append(fv, s.Shard(wv, u.idx)...)
			} else {
				fm = append(fm, wm...)
				fv = append(fv, wv...)
			}
		}
		copy(u.m, fm)
		copy(u.v, fv)
	}
}
