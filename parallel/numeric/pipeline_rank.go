package numeric

import (
	"context"
	"errors"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// runRank is one (pipeline rank, data-parallel rank)'s step over the
// micro-steps' channels links; it writes its last stage's micro-batch
// losses into losses.
func (p *PipelineTrainer) runRank(ctx context.Context, ep *collective.Endpoint, pr *pipeRank, losses, auxes []float64, links [][]*pipeLinks) error {
	st, err := p.newPipeStep(ctx, ep, pr, losses, auxes)
	if err != nil {
		return err
	}
	for _, step := range job.PipelineStep([][]job.PipeAction{p.order[pr.rank]}, p.m, p.spec.GradAccum)[0] {
		if err := st.run(step, links[step.Accum][pr.lane]); err != nil {
			return err
		}
	}
	return st.update()
}

// pipeStep is one (pipeline rank, stage rank)'s state through one step
// (runRank): its stages' runners per micro-batch, the step's loads of
// their MoE layers, what backward needs of the aux loss, and the weight
// passes still to run.
type pipeStep struct {
	p   *PipelineTrainer
	ctx context.Context
	ep  *collective.Endpoint
	pr  *pipeRank
	tc  *tpComm // nil without tensor parallelism
	// Every tp rank routes the same tokens: the aux loss's gradient, and
	// the micro-batch's loss, are one member's.
	lead   bool
	scale  float64 // each backward's scale: one over the step's micro-batches
	useAux bool
	coef   float64 // scale × the aux loss's coefficient
	gw, gg ref.GlobalWeights[float32]
	loads  [][]int64 // the step's routed rows per [layer][expert] of its stages' MoE layers

	// Per micro-batch runners: a block keeps its micro-batch's state from
	// forward to backward, and several micro-batches are in flight.
	blocks  []map[int]*ref.Block[float32]
	embeds  []*ref.Embedding[float32]
	heads   []*ref.Head[float32]
	experts []*epStage // per micro-batch under ep

	// Per micro-batch, what backward needs of the aux loss: HF's shared
	// gradient (the last stage's), or with SeqAuxLoss each layer's own.
	auxShared [][]float32
	auxLayer  []map[int][]float32
	// Per micro-batch and stage, the weight gradients a backward-input
	// pass queued for its weight pass.
	queues []map[int]*ref.WeightQueue

	losses, auxes []float64 // per micro-batch in one rank's order, written by the last stage
}

// newPipeStep gathers pr's tensors, which stay gathered to the end of the
// step, and makes the step's runners.
func (p *PipelineTrainer) newPipeStep(ctx context.Context, ep *collective.Endpoint, pr *pipeRank, losses, auxes []float64) (*pipeStep, error) {
	cfg, sp := p.spec.Model, p.spec
	st := &pipeStep{p: p, ctx: ctx, ep: ep, pr: pr, lead: pr.coord.TP == 0, scale: 1 / float64(sp.GradAccum*p.dp*p.m),
		useAux: sp.AuxCoef != 0 && cfg.IsMoE(), losses: losses, auxes: auxes}
	st.coef = st.scale * sp.AuxCoef
	if p.tp > 1 {
		mesh := ep.Comm().Mesh()
		st.tc = newTPComm(mesh.Group(parallel.AxisTP, pr.lane), pr.lane, p.batch, cfg, sp.Layout, sp.storage, sp.AC)
		st.tc.bind(ctx, ep)
	}
	if err := st.gather(); err != nil {
		return nil, err
	}
	st.gw, st.gg = pr.model.Globals()
	st.loads = make([][]int64, cfg.Layers)
	for _, s := range pr.stages {
		for li := p.first[s]; li < p.first[s+1]; li++ {
			if cfg.MoELayer[li] {
				st.loads[li] = make([]int64, cfg.Experts)
			}
		}
	}
	st.newRunners()
	st.auxShared = make([][]float32, p.m)
	st.auxLayer = make([]map[int][]float32, p.m)
	st.queues = make([]map[int]*ref.WeightQueue, p.m)
	for j := range st.queues {
		st.queues[j] = map[int]*ref.WeightQueue{}
	}
	return st, nil
}

// gather all-gathers the FSDP chunks of pr's tensors into its model.
func (st *pipeStep) gather() error {
	pr := st.pr
	ts := pr.model.Tensors()
	for i, sh := range pr.shard {
		if sh == nil || pr.group[i].Size() == 1 {
			continue
		}
		full, err := st.ep.AllGather(st.ctx, pr.group[i], moe.F32, sh)
		if err != nil {
			return err
		}
		copy(ts[i], full)
	}
	return nil
}

// newRunners makes every micro-batch's runners of pr's stages: the blocks
// (routing their experts through the micro-batch's epStage under ep), the
// embedding and the head.
func (st *pipeStep) newRunners() {
	p, cfg, sp := st.p, st.p.spec.Model, st.p.spec
	o := ref.Options{AC: sp.AC, Precision: sp.storage, AuxCoef: sp.AuxCoef}
	st.blocks = make([]map[int]*ref.Block[float32], p.m)
	st.embeds = make([]*ref.Embedding[float32], p.m)
	st.heads = make([]*ref.Head[float32], p.m)
	if p.ep > 1 {
		st.experts = make([]*epStage, p.m)
		weights, grads := p.localExperts(st.pr)
		for j := range st.experts {
			st.experts[j] = &epStage{cfg: p.lcfg, dtype: sp.storage.Activation, ac: sp.AC, weights: weights, grads: grads}
			st.experts[j].bind(st.ctx, st.ep)
		}
	}
	for j := range p.m {
		st.blocks[j] = map[int]*ref.Block[float32]{}
		for _, s := range st.pr.stages {
			for li := p.first[s]; li < p.first[s+1]; li++ {
				st.blocks[j][li] = ref.NewBlock[float32](p.lcfg, li, p.batch.LBS, p.batch.Seq, o)
				if st.experts != nil && cfg.MoELayer[li] {
					st.blocks[j][li].Experts = st.experts[j]
				}
			}
		}
		st.embeds[j], st.heads[j] = ref.NewEmbedding[float32](p.lcfg, o), ref.NewHead[float32](p.lcfg, o)
	}
}

// stageBlocks are micro-batch j's blocks of stage s, in layer order.
func (st *pipeStep) stageBlocks(s, j int) []*ref.Block[float32] {
	lo, hi := st.p.first[s], st.p.first[s+1]
	out := make([]*ref.Block[float32], 0, hi-lo)
	for li := lo; li < hi; li++ {
		out = append(out, st.blocks[j][li])
	}
	return out
}

// epFailed is the first error of the EP stages: an EP all-to-all that
// failed left zeros behind it (ref.ExpertStage has no error result), so
// the rank stops at the next action.
func (st *pipeStep) epFailed() error {
	for _, s := range st.experts {
		if s.err != nil {
			return s.err
		}
	}
	return nil
}

// run runs action act of micro-step a, whose channels are links.
func (st *pipeStep) run(step job.PipeStep, links *pipeLinks) error {
	p := st.p
	// A failed tp collective left zeros behind it: stop at the
	// next action (the communicator cancels the other ranks).
	if err := errors.Join(st.tc.failed(), st.epFailed()); err != nil {
		return err
	}
	s, j := step.Stage, step.Micro
	k := (step.Accum*p.dp+st.pr.d)*p.m + j // the micro-batch in one rank's order
	switch {
	case step.Kind == job.PipeF:
		return st.forward(s, j, k, links)
	case step.Kind == job.PipeW && s > 0:
		return st.weightPass(step)
	case step.Kind == job.PipeI && s == 0:
		// PyTorch's first stage runs nothing at its input pass and
		// the whole backward at its weight pass.
		return nil
	case step.Kind == job.PipeI:
		q := &ref.WeightQueue{}
		st.queues[j][s] = q
		st.deferGrads(s, j, q)
		return st.backward(step, true, links)
	}
	return st.backward(step, false, links)
}

// deferGrads makes stage s's runners of micro-batch j (its blocks with
// their EP stage, and the last stage's head) queue their weight-gradient
// GEMMs on q, or, given nil, run them again.
func (st *pipeStep) deferGrads(s, j int, q *ref.WeightQueue) {
	for _, blk := range st.stageBlocks(s, j) {
		blk.DeferWeightGrads(q)
	}
	if s == len(st.p.split)-1 {
		st.heads[j].DeferWeightGrads(q)
	}
}

// weightPass runs the weight-gradient GEMMs that the micro-batch's input
// pass of the stage queued.
func (st *pipeStep) weightPass(step job.PipeStep) error {
	s, j := step.Stage, step.Micro
	st.queues[j][s].Run()
	delete(st.queues[j], s)
	return st.completed(step)
}

// completed is called after each action that completes a micro-batch's
// weight gradients of a stage (a full backward or a weight pass): after
// the stage's last of the step (job.PipeStep.Reduce in the last
// micro-step) its gradients are complete, and the replicated ones are
// summed over tp there, where the program's reduction of the stage starts.
func (st *pipeStep) completed(step job.PipeStep) error {
	p := st.p
	if !step.Reduce || step.Accum < p.spec.GradAccum-1 || st.tc == nil {
		return nil
	}
	return p.tpReduceReplicated(st.ctx, st.ep, st.tc, st.pr, step.Stage, p.first[step.Stage])
}

// forward runs micro-batch j (k in one rank's order) through stage s: it
// takes the stage's input, runs the blocks with their aux-loss terms, and
// sends the output to stage s + 1, or, on the last stage, computes the
// loss.
func (st *pipeStep) forward(s, j, k int, links *pipeLinks) error {
	p, cfg, sp := st.p, st.p.spec.Model, st.p.spec
	// Stage 0 reads the micro-batch's tokens, the last stage its
	// labels (the data loader feeds both, as torchtitan's does).
	seqs := p.batch.Sequences(sp.DataSeed, cfg.Vocab, p.step, k, 0)
	ids, labels := nextTokenPairs(seqs, sp.Seq)
	msg, err := st.forwardInput(s, j, ids, links)
	if err != nil {
		return err
	}
	st.forwardBlocks(s, j, &msg)
	if st.useAux {
		st.forwardAux(s, j, &msg)
	}
	if s < len(p.split)-1 {
		links.act[s][j] <- msg
		return nil
	}
	st.loss(j, k, msg, labels)
	return nil
}

// forwardInput is stage s's input of micro-batch j: on stage 0 the
// embedding of ids (under tp, reduce-scattered into the rank's
// sequence-parallel shard) with empty aux totals, else stage s − 1's
// message.
func (st *pipeStep) forwardInput(s, j int, ids []int, links *pipeLinks) (fwdMsg, error) {
	cfg, tc := st.p.spec.Model, st.tc
	switch {
	case s == 0 && tc != nil:
		x := tc.Scatter(moe.LayerEmbed, moe.Forward, st.embeds[j].ForwardShard(st.gw.Embed, ids, tc.vocabLo))
		return fwdMsg{x: x, cnt: make([]float64, cfg.Experts), sum: make([]float64, cfg.Experts)}, nil
	case s == 0:
		return fwdMsg{x: st.embeds[j].Forward(st.gw.Embed, ids), cnt: make([]float64, cfg.Experts), sum: make([]float64, cfg.Experts)}, nil
	}
	select {
	case msg := <-links.act[s-1][j]:
		return msg, nil
	case <-st.ctx.Done():
		return fwdMsg{}, st.ctx.Err()
	}
}

// forwardBlocks runs stage s's blocks of micro-batch j on msg.x and adds
// their routed rows to the step's loads.
func (st *pipeStep) forwardBlocks(s, j int, msg *fwdMsg) {
	for li := st.p.first[s]; li < st.p.first[s+1]; li++ {
		w, _ := st.pr.model.Layer(li)
		if st.tc != nil {
			msg.x = st.blocks[j][li].ForwardSP(&w, msg.x, st.tc)
		} else {
			msg.x = st.blocks[j][li].Forward(&w, msg.x)
		}
		for e, c := range st.blocks[j][li].ExpertCounts() {
			st.loads[li][e] += int64(c)
		}
	}
}

// forwardAux adds stage s's blocks' aux-loss terms of micro-batch j to
// msg: their per-expert totals (HF's loss, computed on the last stage), or
// with SeqAuxLoss their losses, keeping each layer's gradient for its
// backward.
func (st *pipeStep) forwardAux(s, j int, msg *fwdMsg) {
	cfg := st.p.spec.Model
	stageBlocks := st.stageBlocks(s, j)
	if !cfg.SeqAuxLoss {
		ref.AuxPartial(stageBlocks, msg.cnt, msg.sum)
		return
	}
	v, grads := ref.AuxLoss(cfg, stageBlocks, st.coef)
	msg.aux += v
	if st.auxLayer[j] == nil {
		// Kept across the rank's stages: one micro-batch
		// may be in flight in two of them.
		st.auxLayer[j] = map[int][]float32{}
	}
	for i, g := range grads {
		st.auxLayer[j][st.p.first[s]+i] = g
	}
}

// loss computes, on the last stage, micro-batch j's cross-entropy from its
// output msg.x and labels, and HF's aux loss and its gradient from the
// totals msg carried; the lead records both as micro-batch k's.
func (st *pipeStep) loss(j, k int, msg fwdMsg, labels []int) {
	p, cfg, tc := st.p, st.p.spec.Model, st.tc
	var loss float64
	if tc != nil {
		loss = st.heads[j].ForwardTP(&st.gw, msg.x, labels, tc.vocabLo, cfg.Vocab, tc)
	} else {
		loss = st.heads[j].Forward(&st.gw, msg.x, labels)
	}
	if st.useAux && !cfg.SeqAuxLoss {
		msg.aux, st.auxShared[j] = ref.AuxFromTotals[float32](cfg, p.batch.LBS, p.batch.Seq, msg.cnt, msg.sum, st.coef)
	}
	if st.lead {
		st.losses[k], st.auxes[k] = loss, msg.aux
	}
}

// backward runs a micro-batch's backward through a stage (step):
// it takes the gradient of the stage's output, runs the blocks backward
// and sends the input's gradient to stage s − 1, or, on stage 0, adds it
// to the embedding's gradient. An input pass (input: the weight-gradient
// GEMMs were queued by deferGrads) leaves the stage's weight gradients to
// its weight pass; any other backward completes them.
func (st *pipeStep) backward(step job.PipeStep, input bool, links *pipeLinks) error {
	s, j := step.Stage, step.Micro
	msg, err := st.outputGrad(s, j, links)
	if err != nil {
		return err
	}
	st.backwardBlocks(s, j, &msg)
	if input {
		st.deferGrads(s, j, nil)
	}
	switch {
	case s == 0 && st.tc != nil:
		st.embeds[j].BackwardShard(st.gg.Embed, st.tc.Gather(moe.LayerEmbed, moe.BackwardData, msg.dx), st.tc.vocabLo)
	case s == 0:
		st.embeds[j].Backward(st.gg.Embed, msg.dx)
	default:
		links.grad[s][j] <- msg
	}
	if input {
		return nil
	}
	return st.completed(step)
}

// outputGrad is the gradient of stage s's output of micro-batch j: on the
// last stage the loss's, scaled by scale, with HF's aux gradient; else
// stage s + 1's message.
func (st *pipeStep) outputGrad(s, j int, links *pipeLinks) (bwdMsg, error) {
	cfg, tc, last := st.p.spec.Model, st.tc, s == len(st.p.split)-1
	switch {
	case last && tc != nil:
		return bwdMsg{dx: st.heads[j].BackwardTP(&st.gw, &st.gg, st.scale, tc.vocabLo, cfg.Vocab, tc), auxGrad: st.auxShared[j]}, nil
	case last:
		return bwdMsg{dx: st.heads[j].Backward(&st.gw, &st.gg, st.scale), auxGrad: st.auxShared[j]}, nil
	}
	select {
	case msg := <-links.grad[s+1][j]:
		return msg, nil
	case <-st.ctx.Done():
		return bwdMsg{}, st.ctx.Err()
	}
}

// backwardBlocks runs stage s's blocks of micro-batch j backward, last to
// first, on msg.dx, the lead adding the aux loss's gradient at each MoE
// layer.
func (st *pipeStep) backwardBlocks(s, j int, msg *bwdMsg) {
	cfg := st.p.spec.Model
	for li := st.p.first[s+1] - 1; li >= st.p.first[s]; li-- {
		w, g := st.pr.model.Layer(li)
		var ag []float32
		switch {
		case !st.useAux || !cfg.MoELayer[li] || !st.lead:
		case cfg.SeqAuxLoss:
			ag = st.auxLayer[j][li]
		default:
			ag = msg.auxGrad
		}
		if st.tc != nil {
			msg.dx = st.blocks[j][li].BackwardSP(&w, &g, msg.dx, ag, st.tc)
		} else {
			msg.dx = st.blocks[j][li].Backward(&w, &g, msg.dx, ag)
		}
	}
}

// update ends the step: the selection biases of pr's MoE layers move by
// the step's loads, and AdamW updates pr's chunks.
func (st *pipeStep) update() error {
	if err := st.sumLoads(); err != nil {
		return err
	}
	if err := errors.Join(st.tc.failed(), st.epFailed()); err != nil {
		return err
	}
	st.pr.model.UpdateSelectionBias(st.loads, st.p.spec.BiasRate)
	return st.adamW()
}

// sumLoads sums the step's loads over the stage's data-parallel ranks (its
// replica's, then over the replicas). With the routed rows split over the
// tp ranks (ep > 1 at etp 1) each counted its own rows: they are summed
// over the tp group first; otherwise every tp rank counted the same rows
// and the dp_shard group of its tp index sums them once.
func (st *pipeStep) sumLoads() error {
	mesh := st.ep.Comm().Mesh()
	sums := []parallel.Group{mesh.Group(parallel.AxisShard, st.pr.lane), mesh.Group(parallel.AxisReplicate, st.pr.lane)}
	if st.tc != nil && st.tc.splitRows {
		sums = append([]parallel.Group{st.tc.group}, sums...)
	}
	if !st.p.spec.Model.SelectionBias || !slices.ContainsFunc(sums, func(g parallel.Group) bool { return g.Size() > 1 }) {
		return nil
	}
	var flat []float32
	for _, ld := range st.loads {
		for _, c := range ld {
			flat = append(flat, float32(c))
		}
	}
	for _, g := range sums {
		if g.Size() == 1 {
			continue
		}
		if err := st.ep.AllReduce(st.ctx, g, moe.F32, flat); err != nil {
			return err
		}
	}
	at := 0
	for _, ld := range st.loads {
		for e := range ld {
			ld[e] = int64(flat[at])
			at++
		}
	}
	return nil
}

// adamW reduces the step's gradients of every tensor pr holds a chunk of
// (reduce-scattered over the chunk's group, then all-reduced over the
// replicas), applies AdamW to the chunk and clears the gradients.
func (st *pipeStep) adamW() error {
	pr := st.pr
	rep := st.ep.Comm().Mesh().Group(parallel.AxisReplicate, pr.lane)
	ts, gs := pr.model.Tensors(), pr.model.Grads()
	for i := range ts {
		if pr.shard[i] == nil {
			continue
		}
		g := gs[i]
		if n := pr.group[i].Size(); n > 1 {
			padded := make([]float32, n*len(pr.shard[i]))
			copy(padded, gs[i])
			g = make([]float32, len(pr.shard[i]))
			if err := st.ep.ReduceScatter(st.ctx, pr.group[i], moe.F32, padded, g); err != nil {
				return err
			}
		}
		if rep.Size() > 1 {
			if err := st.ep.AllReduce(st.ctx, rep, moe.F32, g); err != nil {
				return err
			}
		}
		ref.AdamWStep(st.p.spec.AdamW, &pr.adam[i], pr.shard[i], g)
		clear(gs[i])
	}
	return nil
}

// tpReduceReplicated sums over pr's tp group the step's gradients of
// stage s, whose first layer is first, of its replicated tensors, one
// all-reduce per unit in the order the pipeline's reduction runs them
// (parallel.Pipeline: the stage's units in backward order), in the type
// the gradients were accumulated in.
func (p *PipelineTrainer) tpReduceReplicated(ctx context.Context, ep *collective.Endpoint, tc *tpComm, pr *pipeRank, s, first int) error {
	cfg := p.spec.Model
	ps, gs := cfg.Params(), pr.model.Grads()
	dt := p.spec.storage.Compute
	if p.m > 1 {
		dt = p.spec.storage.Grad
	}
	var layers []int // the stage's units in backward order
	if s == len(p.split)-1 {
		layers = append(layers, cfg.LayerHead())
	}
	for li := first + p.split[s] - 1; li >= first; li-- {
		layers = append(layers, li)
	}
	if s == 0 {
		layers = append(layers, moe.LayerEmbed)
	}
	for _, layer := range layers {
		var rep [][]float32
		for _, i := range p.ux.ByLayer[layer] {
			if ps[i].TP == moe.TPReplicated {
				rep = append(rep, gs[i])
			}
		}
		if err := allReduceJoined(ctx, ep, tc.group, dt, rep); err != nil {
			return err
		}
	}
	return nil
}

// localExperts returns the epStage's views of pr's routed experts (those
// of its EP index): per MoE layer of its stages, the weights and the
// gradient accumulators of each local expert (gate, up, down).
func (p *PipelineTrainer) localExperts(pr *pipeRank) (weights, grads func(layer int) (gate, up, down [][]float32)) {
	cfg := p.spec.Model
	e, el := pr.coord.EP, p.el
	ix := map[int][3][]int{}
	for li, moeLayer := range cfg.MoELayer {
		if moeLayer {
			ix[li] = expertParamIndex(cfg, li, e*el, (e+1)*el)
		}
	}
	view := func(ts [][]float32) func(int) ([][]float32, [][]float32, [][]float32) {
		return func(layer int) (gate, up, down [][]float32) {
			var out [3][][]float32
			for k, is := range ix[layer] {
				for _, i := range is {
					out[k] = append(out[k], ts[i])
				}
			}
			return out[0], out[1], out[2]
		}
	}
	return view(pr.model.Tensors()), view(pr.model.Grads())
}
