package numeric

import (
	"context"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
)

// trainStep runs one optimizer step of this rank: every micro-step's
// forward and backward with the schedule's gathers, frees and reductions,
// then the loss exchange, the selection-bias update and AdamW. It returns
// every micro-batch's (loss, aux) of the step in one rank's order (micro-step
// m, then data-parallel rank r).
func (r *numRank) trainStep(ctx context.Context, ep *Endpoint, t int) ([]float64, error) {
	cfg, sp := r.cfg, r.spec
	b := sp.Batch
	r.mem.resetPeak()
	r.counts = nil
	if r.stage != nil {
		r.stage.bind(ctx, ep)
		r.stage.afterBackward = func(layer, micro int) error {
			return r.reduceUnit(ctx, ep, r.byKey[parallel.Unit{Layer: layer, Experts: true}], micro)
		}
	}
	scale := 1 / float64(b.DP*b.Micro)
	local := make([]float32, 0, 4*b.Micro)
	loads := make([][]int64, cfg.Layers)
	for li := range loads {
		if cfg.MoELayer[li] {
			loads[li] = make([]int64, cfg.Experts)
		}
	}
	for m := 0; m < b.Micro; m++ {
		seqs := b.Sequences(sp.DataSeed, cfg.Vocab, t, m, r.rank)
		if r.stage != nil {
			r.stage.micro = m
		}
		if r.failAt != nil {
			if err := r.failAt(r.rank, m); err != nil {
				return nil, err
			}
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
	// all is [rank][micro][loss, aux as 2 words each]; reorder to (m, r).
	var out []float64
	for m := 0; m < b.Micro; m++ {
		for rr := 0; rr < dp.Size(); rr++ {
			w := all[(rr*b.Micro+m)*4:]
			out = append(out, wordsF64(w[0:2]), wordsF64(w[2:4]))
		}
	}
	if cfg.SelectionBias && cfg.IsMoE() {
		var flat []float32
		for _, ld := range loads {
			for _, n := range ld {
				flat = append(flat, float32(n))
			}
		}
		if dp.Size() > 1 {
			if err := ep.AllReduce(ctx, dp, moe.F32, flat); err != nil {
				return nil, err
			}
		}
		k := 0
		for li := range loads {
			for e := range loads[li] {
				loads[li][e] = int64(flat[k])
				k++
			}
		}
		r.scratch.UpdateSelectionBias(loads, sp.BiasRate)
	}
	if err := r.optimize(ctx, ep); err != nil {
		return nil, err
	}
	return out, nil
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
func (r *numRank) reduceUnit(ctx context.Context, ep *Endpoint, u *numUnit, micro int) error {
	g := r.takeGrads(u)
	var n int64
	for _, t := range g {
		n += int64(len(t))
	}
	by := n * r.spec.Precision.Grad.Bytes()
	r.mem.alloc(by)
	err := r.reduce(ctx, ep, u, g, micro)
	r.mem.free(by)
	return err
}

// microStep runs one micro-batch's forward and backward.
func (r *numRank) microStep(ctx context.Context, ep *Endpoint, seqs [][]int32, micro int, scale float64, loads [][]int64) (loss, aux float64, err error) {
	cfg, sp := r.cfg, r.spec
	l := sp.Mesh.Layout
	ra, keep := l.ReshardAfterForward, l.KeepGathered
	last := micro == sp.Batch.Micro-1
	S := sp.Batch.Seq
	T := len(seqs) * S
	ids, labels := make([]int, T), make([]int, T)
	for i, s := range seqs {
		for j := 0; j < S; j++ {
			ids[i*S+j], labels[i*S+j] = int(s[j]), int(s[j+1])
		}
	}
	emb := r.byKey[parallel.Unit{Layer: moe.LayerEmbed}]
	head := r.byKey[parallel.Unit{Layer: cfg.LayerHead()}]

	// Forward.
	if err := r.gather(ctx, ep, emb); err != nil {
		return 0, 0, err
	}
	gw, _ := r.scratch.Globals()
	x := r.embed.Forward(gw.Embed, ids)
	if ra && !cfg.TiedEmbeddings {
		r.release(emb)
	}
	for li, blk := range r.blocks {
		if err := r.gatherLayer(ctx, ep, li); err != nil {
			return 0, 0, err
		}
		x = blk.Forward(r.layerWeights(li), x)
		if err := r.stageErr(); err != nil {
			return 0, 0, err
		}
		for e, n := range blk.ExpertCounts() {
			loads[li][e] += int64(n)
		}
		if ra && li != cfg.Layers-1 {
			r.releaseLayer(li)
		}
	}
	if err := r.gather(ctx, ep, head); err != nil {
		return 0, 0, err
	}
	// HF's load-balancing loss of this micro-batch (computed locally, as
	// Megatron does) and its gradient per layer, from the blocks' routing.
	var auxGrad [][]float32
	if sp.AuxCoef != 0 && cfg.IsMoE() {
		aux, auxGrad = moe.AuxLoss(cfg, r.blocks, scale*sp.AuxCoef)
	}
	// Head forward and backward (the loss's gradient starts here).
	r.zeroGrads(head)
	if cfg.TiedEmbeddings {
		r.zeroGrads(emb)
	}
	gw, gg := r.scratch.Globals()
	loss = r.headRun.Forward(&gw, x, labels)
	dx := r.headRun.Backward(&gw, &gg, scale)
	r.rec.release(cfg.LayerHead())
	if err := r.reduceUnit(ctx, ep, head, micro); err != nil {
		return 0, 0, err
	}
	if !keep || last {
		r.release(head)
	}
	// Backward through the blocks.
	for li := cfg.Layers - 1; li >= 0; li-- {
		if err := r.gatherLayer(ctx, ep, li); err != nil {
			return 0, 0, err
		}
		dense := r.byKey[parallel.Unit{Layer: li}]
		ex := r.byKey[parallel.Unit{Layer: li, Experts: true}]
		r.zeroGrads(dense)
		if ex != nil {
			r.zeroGrads(ex)
		}
		var ag []float32
		if auxGrad != nil {
			ag = auxGrad[li]
		}
		w := r.layerWeights(li)
		g := r.layerGrads(li)
		dx = r.blocks[li].Backward(w, g, dx, ag)
		if err := r.stageErr(); err != nil {
			return 0, 0, err
		}
		r.rec.release(li)
		// Without expert parallelism the expert gradients are reduced here
		// (with it, the EP stage reduced them between its two all-to-alls).
		if ex != nil && r.stage == nil {
			if err := r.reduceUnit(ctx, ep, ex, micro); err != nil {
				return 0, 0, err
			}
		}
		if err := r.reduceUnit(ctx, ep, dense, micro); err != nil {
			return 0, 0, err
		}
		if !keep || last {
			r.releaseLayer(li)
		}
	}
	// Embedding backward: scatter-add the input gradient into the rows read.
	if err := r.gather(ctx, ep, emb); err != nil {
		return 0, 0, err
	}
	if !cfg.TiedEmbeddings {
		r.zeroGrads(emb)
	}
	_, gg = r.scratch.Globals()
	r.embed.Backward(gg.Embed, dx)
	r.rec.release(moe.LayerEmbed)
	if err := r.reduceUnit(ctx, ep, emb, micro); err != nil {
		return 0, 0, err
	}
	if !keep || last {
		r.release(emb)
	}
	return loss, aux, nil
}

func (r *numRank) stageErr() error {
	if r.stage != nil && r.stage.err != nil {
		return r.stage.err
	}
	return nil
}

// gatherLayer makes layer li's dense and expert units live.
func (r *numRank) gatherLayer(ctx context.Context, ep *Endpoint, li int) error {
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

func (r *numRank) layerWeights(li int) *moe.LayerWeights[float32] {
	w, _ := r.scratch.Layer(li)
	return &w
}

func (r *numRank) layerGrads(li int) *moe.LayerWeights[float32] {
	_, g := r.scratch.Layer(li)
	return &g
}
