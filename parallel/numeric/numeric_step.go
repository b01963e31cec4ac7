package numeric

import (
	"context"
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// trainStep runs one optimizer step of this rank: every micro-step's
// forward and backward with the schedule's gathers, frees and reductions,
// then the loss exchange, the selection-bias update and AdamW. It returns
// every micro-batch's (loss, aux) of the step in one rank's order (micro-step
// m, then data-parallel rank r).
func (r *numRank) trainStep(ctx context.Context, ep *collective.Endpoint, t int) ([]float64, error) {
	cfg, sp := r.cfg, r.spec
	b := sp.data()
	r.mem.resetPeak()
	r.counts = nil
	r.order = job.NewStepOrder(cfg, sp.Mesh.Layout, b.GradAccum)
	if r.tp != nil {
		r.tp.bind(ctx, ep)
	}
	if r.cp != nil {
		r.cp.bind(ctx, ep)
	}
	micro := 0 // the micro-step being run, for the hooks below
	if r.tp != nil && r.stage == nil {
		r.tp.expertsDone = func(layer int) error {
			return r.reduceUnit(ctx, ep, r.byKey[parallel.Unit{Layer: layer, Experts: true}], micro)
		}
	}
	if r.stage != nil {
		r.stage.bind(ctx, ep)
		r.stage.afterBackward = func(layer, micro int) error {
			return r.reduceUnit(ctx, ep, r.byKey[parallel.Unit{Layer: layer, Experts: true}], micro)
		}
	}
	// The gradients are summed over the data-parallel ranks' cp ranks
	// too, each holding its own tokens' mean cross-entropy: 1/cp of each.
	cp := sp.CP.degree()
	scale := 1 / float64(b.DP*cp*b.GradAccum)
	local := make([]float32, 0, 4*b.GradAccum)
	loads := make([][]int64, cfg.Layers)
	for li := range loads {
		if cfg.MoELayer[li] {
			loads[li] = make([]int64, cfg.Experts)
		}
	}
	for m := 0; m < b.GradAccum; m++ {
		micro = m
		// The tp ranks of a group read their data-parallel rank's sequences.
		// So do the cp ranks, each taking its shard (microStep).
		seqs := b.Sequences(sp.DataSeed, cfg.Vocab, t, m, r.coord.DPRank(sp.Mesh.Layout)/cp)
		if r.stage != nil {
			r.stage.micro = m
		}
		if r.fault.strikes(r.rank, t, m) {
			if !r.fault.Stall {
				return nil, fmt.Errorf("step %d, micro-step %d: %w", t+1, m, ErrInjectedFault)
			}
			r.rec.stall = true
		}
		loss, aux, err := r.microStep(ctx, ep, seqs, m, scale, loads)
		if err != nil {
			return nil, err
		}
		counts := make([][]int, cfg.Layers)
		for li, blk := range r.blocks {
			counts[li] = append([]int(nil), blk.ExpertCounts()...)
		}
		r.counts = append(r.counts, counts)
		local = append(local, f64Words(loss)...)
		local = append(local, f64Words(aux)...)
	}
	all := local
	dp := ep.Comm().Mesh().Group(parallel.AxisDP, r.rank)
	if dp.Size() > 1 {
		g, err := ep.AllGather(ctx, dp, moe.F32, local)
		if err != nil {
			return nil, err
		}
		all = g
	}
	// all is [rank][micro][loss, aux as 2 words each]; reorder to (m, r),
	// r the data-parallel rank (the members of a tp group hold the same
	// values: take each group's first, rank r·tp; the members of a cp
	// group hold their shards' mean cross-entropies, whose mean is the
	// sequences', and the same aux loss).
	var out []float64
	tp := sp.Mesh.Layout.TPDegree()
	for m := 0; m < b.GradAccum; m++ {
		for rr := 0; rr < dp.Size()/(tp*cp); rr++ {
			var loss float64
			for c := 0; c < cp; c++ {
				loss += wordsF64(all[((rr*cp+c)*tp*b.GradAccum+m)*4:][0:2])
			}
			w := all[(rr*cp*tp*b.GradAccum+m)*4:]
			out = append(out, loss/float64(cp), wordsF64(w[2:4]))
		}
	}
	if cfg.SelectionBias && cfg.IsMoE() {
		if err := r.updateSelectionBias(ctx, ep, dp, loads); err != nil {
			return nil, err
		}
	}
	if err := r.optimize(ctx, ep); err != nil {
		return nil, err
	}
	return out, nil
}

// updateSelectionBias sums the step's routed rows per expert, loads
// [layer][expert], over the data-parallel group dp, so that every replica
// moves its selection biases by the same global load, and moves them.
func (r *numRank) updateSelectionBias(ctx context.Context, ep *collective.Endpoint, dp parallel.Group, loads [][]int64) error {
	var flat []float32
	for _, ld := range loads {
		for _, n := range ld {
			if r.coord.TP != 0 && !r.tp.splitRows {
				// Every member of the tp group dispatched the same rows:
				// count them once (with the rows split, each counted its own).
				n = 0
			}
			flat = append(flat, float32(n))
		}
	}
	if dp.Size() > 1 {
		if err := ep.AllReduce(ctx, dp, moe.F32, flat); err != nil {
			return err
		}
	}
	k := 0
	for li := range loads {
		for e := range loads[li] {
			loads[li][e] = int64(flat[k])
			k++
		}
	}
	r.loads = loads
	r.scratch.UpdateSelectionBias(loads, r.spec.BiasRate)
	return nil
}

// f64Words splits a float64's bits into two float32 words (exact transport).
func f64Words(x float64) []float32 {
	b := math.Float64bits(x)
	return []float32{math.Float32frombits(uint32(b >> 32)), math.Float32frombits(uint32(b))}
}

func wordsF64(w []float32) float64 {
	return math.Float64frombits(uint64(math.Float32bits(w[0]))<<32 | uint64(math.Float32bits(w[1])))
}

// reduceUnit takes u's micro-step gradients from the scratch views,
// reduces them and releases the unsharded gradient buffer.
func (r *numRank) reduceUnit(ctx context.Context, ep *collective.Endpoint, u *numUnit, micro int) error {
	g := r.takeGrads(u)
	var n int64
	for _, t := range g {
		n += int64(len(t))
	}
	by := n * r.spec.storage.Grad.Bytes()
	r.mem.alloc(by)
	err := r.reduce(ctx, ep, u, g, micro)
	r.mem.free(by)
	return err
}

// microStep runs one micro-batch's forward and backward: the embedding
// and blocks forward, the loss and its gradient at the head, then backward
// through the blocks and the embedding, each unit's gradients reduced as
// its backward ends. loads accumulates each MoE layer's routed rows per
// expert.
func (r *numRank) microStep(ctx context.Context, ep *collective.Endpoint, seqs [][]int32, micro int, scale float64, loads [][]int64) (loss, aux float64, err error) {
	ids, labels := nextTokenPairs(seqs, r.spec.Batch.Seq)
	if r.cp != nil {
		ids, labels = shardTokens(ids, labels, r.spec.Batch.Seq, r.cp.pos[r.cp.idx])
	}
	x, err := r.forward(ctx, ep, ids, micro, loads)
	if err != nil {
		return 0, 0, err
	}
	// HF's load-balancing loss of this micro-batch (computed locally, as
	// Megatron does) and its gradient per layer, from the blocks' routing.
	var auxGrad [][]float32
	if r.spec.AuxCoef != 0 && r.cfg.IsMoE() && r.cp != nil {
		if aux, auxGrad, err = r.cpAuxLoss(ctx, ep, scale); err != nil {
			return 0, 0, err
		}
	} else if r.spec.AuxCoef != 0 && r.cfg.IsMoE() {
		aux, auxGrad = ref.AuxLoss(r.cfg, r.blocks, scale*r.spec.AuxCoef)
	}
	loss, dx, err := r.headStep(ctx, ep, x, labels, scale, micro)
	if err != nil {
		return 0, 0, err
	}
	if dx, err = r.backwardBlocks(ctx, ep, dx, auxGrad, micro); err != nil {
		return 0, 0, err
	}
	if err := r.backwardEmbed(ctx, ep, dx, micro); err != nil {
		return 0, 0, err
	}
	return loss, aux, nil
}

// nextTokenPairs flattens sequences of S+1 tokens into the inputs ids [T]
// and their next-token labels [T], T = len(seqs)·S.
func nextTokenPairs(seqs [][]int32, S int) (ids, labels []int) {
	T := len(seqs) * S
	ids, labels = make([]int, T), make([]int, T)
	for i, s := range seqs {
		for j := 0; j < S; j++ {
			ids[i*S+j], labels[i*S+j] = int(s[j]), int(s[j+1])
		}
	}
	return ids, labels
}

// forward runs micro-step micro's forward of the embedding and every
// block on ids, gathering each unit before it runs and releasing it after
// where the step's order says (job.StepOrder), and gathers the head. It
// returns the last block's output x [T,D] and adds each MoE layer's routed
// rows to loads.
func (r *numRank) forward(ctx context.Context, ep *collective.Endpoint, ids []int, micro int, loads [][]int64) ([]float32, error) {
	cfg := r.cfg
	fw := func(layer int) job.StepPhase { return r.order.Phase(job.StepForward, micro, layer) }
	emb := r.byKey[parallel.Unit{Layer: moe.LayerEmbed}]
	if err := r.gather(ctx, ep, emb); err != nil {
		return nil, err
	}
	gw, _ := r.scratch.Globals()
	var x []float32
	if r.tp != nil {
		// RowwiseParallel embedding: partial rows, reduce-scattered into
		// the sequence-parallel region.
		x = r.tp.Scatter(moe.LayerEmbed, moe.Forward, r.embed.ForwardShard(gw.Embed, ids, r.tp.vocabLo))
	} else {
		x = r.embed.Forward(gw.Embed, ids)
	}
	if fw(moe.LayerEmbed).Free {
		r.release(emb)
	}
	for li, blk := range r.blocks {
		if err := r.gatherLayer(ctx, ep, li); err != nil {
			return nil, err
		}
		if r.tp != nil {
			x = blk.ForwardSP(r.layerWeights(li), x, r.tp)
		} else {
			x = blk.Forward(r.layerWeights(li), x)
		}
		if err := r.stageErr(); err != nil {
			return nil, err
		}
		for e, n := range blk.ExpertCounts() {
			loads[li][e] += int64(n)
		}
		if fw(li).Free {
			r.releaseLayer(li)
		}
	}
	if err := r.gather(ctx, ep, r.byKey[parallel.Unit{Layer: cfg.LayerHead()}]); err != nil {
		return nil, err
	}
	return x, nil
}

// headStep runs the head's forward and backward on x [T,D] (the loss's
// gradient starts here, scaled by scale) and reduces the head's gradients.
// It returns the loss and the gradient dx [T,D] of the head's input.
func (r *numRank) headStep(ctx context.Context, ep *collective.Endpoint, x []float32, labels []int, scale float64, micro int) (float64, []float32, error) {
	cfg := r.cfg
	head := r.byKey[parallel.Unit{Layer: cfg.LayerHead()}]
	r.zeroGrads(head)
	if cfg.TiedEmbeddings {
		// The tied table's gradient starts at the head and is completed
		// by the embedding's backward.
		r.zeroGrads(r.byKey[parallel.Unit{Layer: moe.LayerEmbed}])
	}
	gw, gg := r.scratch.Globals()
	var loss float64
	var dx []float32
	if r.tp != nil {
		loss = r.headRun.ForwardTP(&gw, x, labels, r.tp.vocabLo, cfg.Vocab, r.tp)
		if err := r.headBetween(ctx, ep, head, micro); err != nil {
			return 0, nil, err
		}
		dx = r.headRun.BackwardTP(&gw, &gg, scale, r.tp.vocabLo, cfg.Vocab, r.tp)
	} else {
		loss = r.headRun.Forward(&gw, x, labels)
		if err := r.headBetween(ctx, ep, head, micro); err != nil {
			return 0, nil, err
		}
		dx = r.headRun.Backward(&gw, &gg, scale)
	}
	if err := r.tp.failed(); err != nil {
		return 0, nil, err
	}
	r.rec.release(cfg.LayerHead())
	if err := r.reduceUnit(ctx, ep, head, micro); err != nil {
		return 0, nil, err
	}
	if r.order.Phase(job.StepBackward, micro, cfg.LayerHead()).Free {
		r.release(head)
	}
	return loss, dx, nil
}

// headBetween does to the head's weights what the step's order says
// between its forward and its backward: free them after the forward,
// gather them again for the backward.
func (r *numRank) headBetween(ctx context.Context, ep *collective.Endpoint, head *numUnit, micro int) error {
	layer := r.cfg.LayerHead()
	if r.order.Phase(job.StepForward, micro, layer).Free {
		r.release(head)
	}
	if r.order.Phase(job.StepBackward, micro, layer).Gather {
		return r.gather(ctx, ep, head)
	}
	return nil
}

// backwardBlocks runs every block's backward, last to first, on dy [T,D]
// (auxGrad, when set, adds each layer's load-balancing gradient), and
// reduces each layer's gradients as its backward ends. It returns the
// gradient of the first block's input.
func (r *numRank) backwardBlocks(ctx context.Context, ep *collective.Endpoint, dy []float32, auxGrad [][]float32, micro int) ([]float32, error) {
	dx := dy
	for li := r.cfg.Layers - 1; li >= 0; li-- {
		if err := r.gatherLayer(ctx, ep, li); err != nil {
			return nil, err
		}
		dense := r.byKey[parallel.Unit{Layer: li}]
		ex := r.byKey[parallel.Unit{Layer: li, Experts: true}]
		r.zeroGrads(dense)
		if ex != nil {
			r.zeroGrads(ex)
		}
		var ag []float32
		if auxGrad != nil && r.coord.TP == 0 {
			// Under tp the router's gradients are partial sums over the
			// group's members (their experts' partial outputs); the aux
			// loss, which every member computes whole, joins on one.
			ag = auxGrad[li]
		}
		w := r.layerWeights(li)
		g := r.layerGrads(li)
		if r.tp != nil {
			dx = r.blocks[li].BackwardSP(w, g, dx, ag, r.tp)
		} else {
			dx = r.blocks[li].Backward(w, g, dx, ag)
		}
		if err := r.stageErr(); err != nil {
			return nil, err
		}
		r.rec.release(li)
		// Without expert parallelism the expert gradients are reduced here
		// (with it, the EP stage reduced them between its two all-to-alls;
		// under tp, the block did, through tpComm.ExpertsDone).
		if ex != nil && r.stage == nil && r.tp == nil {
			if err := r.reduceUnit(ctx, ep, ex, micro); err != nil {
				return nil, err
			}
		}
		if err := r.reduceUnit(ctx, ep, dense, micro); err != nil {
			return nil, err
		}
		if r.order.Phase(job.StepBackward, micro, li).Free {
			r.releaseLayer(li)
		}
	}
	return dx, nil
}

// backwardEmbed scatter-adds the input gradient dx [T,D] into the
// embedding rows read and reduces the embedding's gradients.
func (r *numRank) backwardEmbed(ctx context.Context, ep *collective.Endpoint, dx []float32, micro int) error {
	emb := r.byKey[parallel.Unit{Layer: moe.LayerEmbed}]
	if err := r.gather(ctx, ep, emb); err != nil {
		return err
	}
	if !r.cfg.TiedEmbeddings {
		r.zeroGrads(emb)
	}
	_, gg := r.scratch.Globals()
	if r.tp != nil {
		r.embed.BackwardShard(gg.Embed, r.tp.Gather(moe.LayerEmbed, moe.BackwardData, dx), r.tp.vocabLo)
		if err := r.tp.failed(); err != nil {
			return err
		}
	} else {
		r.embed.Backward(gg.Embed, dx)
	}
	r.rec.release(moe.LayerEmbed)
	if err := r.reduceUnit(ctx, ep, emb, micro); err != nil {
		return err
	}
	if r.order.Phase(job.StepBackward, micro, moe.LayerEmbed).Free {
		r.release(emb)
	}
	return nil
}

func (r *numRank) stageErr() error {
	if r.stage != nil && r.stage.err != nil {
		return r.stage.err
	}
	if err := r.cp.failed(); err != nil {
		return err
	}
	return r.tp.failed()
}

// gatherLayer makes layer li's dense and expert units live.
func (r *numRank) gatherLayer(ctx context.Context, ep *collective.Endpoint, li int) error {
	if err := r.gather(ctx, ep, r.byKey[parallel.Unit{Layer: li}]); err != nil {
		return err
	}
	if ex := r.byKey[parallel.Unit{Layer: li, Experts: true}]; ex != nil {
		return r.gather(ctx, ep, ex)
	}
	return nil
}

func (r *numRank) releaseLayer(li int) {
	r.release(r.byKey[parallel.Unit{Layer: li}])
	if ex := r.byKey[parallel.Unit{Layer: li, Experts: true}]; ex != nil {
		r.release(ex)
	}
}

func (r *numRank) layerWeights(li int) *ref.LayerWeights[float32] {
	w, _ := r.scratch.Layer(li)
	return &w
}

func (r *numRank) layerGrads(li int) *ref.LayerWeights[float32] {
	_, g := r.scratch.Layer(li)
	return &g
}
