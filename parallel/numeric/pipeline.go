package numeric

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// PipelineSpec describes a numeric run under pipeline parallelism: one
// goroutine per pipeline rank, each running its stages' layers.
type PipelineSpec struct {
	// Spec is the run: its Layout resolved, pp > 1, one data-parallel
	// rank per stage; its LBS sequences per micro-step split into pipeline
	// micro-batches; its recipe's storage types are the ranks' memory
	// accounts' and messages' (empty fields: job.DefaultRecipe's).
	job.Spec
	DataSeed uint64
	AdamW    ref.AdamW
	AuxCoef  float64 // coefficient of the load-balancing loss; 0 neither computes nor adds it
	BiasRate float64 // selection-bias update rate γ

	storage moe.Precision // the recipe's storage types, resolved by NewPipelineTrainer
}

// PipelineTrainer trains the reference model with one goroutine per
// pipeline rank. Each runs its actions in job.PipelineOrder's order; a
// forward of stage s receives its input from stage s − 1 (stage 0 embeds
// its micro-batch's tokens), runs the stage's blocks and sends the output
// to stage s + 1 (the last stage computes the loss); a backward receives
// the output's gradient from stage s + 1 (the last stage starts from the
// loss), runs the blocks backward and sends the input's gradient to stage
// s − 1 (stage 0 scatters it into the embedding's gradient). Under
// zero-bubble schedules the backward is split for real: the input pass
// runs the blocks' (and the head's) backward with their weight-gradient
// GEMMs queued (ref.WeightQueue: each linear's and each grouped expert
// GEMM's dW, with copies of its input and output gradient kept alive) and
// sends the input's gradient; the weight pass runs the queue. The norms'
// scale gradients are computed in the input pass. On stage 0 the input
// pass does nothing and the weight pass runs the whole backward
// (PyTorch's stage.py). Activations
// and gradients move only through channels, one per (stage boundary,
// direction, micro-batch). The load-balancing aux loss of a micro-batch
// is computed over its tokens and every layer, as one rank computes it:
// HF's formula needs per-expert totals over all MoE layers, which travel
// forward with the activation (each stage adding its layers', in layer
// order); the last stage computes the loss and its gradient, the same for
// every MoE layer, which travels back with the activation's gradient.
// DeepSeek-MoE's per-sequence loss (Config.SeqAuxLoss) is per layer: each
// stage computes its layers' and the partial losses travel forward. Gradients accumulate over the step's
// micro-batches; each rank then updates the selection biases of its MoE
// layers from their loads and applies AdamW to its own parameters.
//
// FSDP inside a stage: each stage has dp_shard data-parallel ranks (its
// own communicator over the stage's mesh, job.Layout.StageLayout), rank d
// talking to rank d of the neighbouring stages. Each holds a 1/dp_shard
// chunk of every tensor of its stages (flat, the last chunk padded) with
// its AdamW moments; the stage's tensors are all-gathered at the start of
// the step and stay gathered to its end (torchtitan does not reshard after
// forward under PP, and PyTorch's stage not after backward until the last
// one), and their gradients, accumulated over the step's micro-batches,
// are reduce-scattered once after the last backward, before AdamW updates
// each chunk.
//
// Micro-batch j of micro-step a on data-parallel rank d reads the
// pp_microbatch_size sequences starting at t·B + ((a·DP + d)·M + j)·b
// (B the global batch, DP = dp_replicate × dp_shard, M = lbs ÷ b micro-batches of b =
// pp_microbatch_size sequences): DESIGN's batch contract for rank d at
// micro-step a, cut into micro-batches, and the micro-batches one rank
// reads at lbs = b with grad-accum = grad-accum × DP × M, in the same
// order. The step's loss is the mean of the micro-batches'
// cross-entropies and each backward is scaled by one over their number,
// so the run equals that rank's up to float32 summation order.
//
// Tensor parallelism inside a stage (tp > 1): a stage's ranks are dp_shard
// × tp (tp innermost, job.Layout.StageLayout); the tp ranks of a
// data-parallel rank read its micro-batches, each holds its tp pieces of
// the stage's tensors (ref.TPShard, as the single-program trainer's ranks
// do, which FSDP then chunks over dp_shard) and runs the blocks with
// sequence parallelism (ref.Block.ForwardSP, the embedding's vocabulary
// rows and loss parallel, tp.go). A stage sends each tp rank's
// sequence-parallel shard of the activation, [batch, seq/tp, hidden], to
// the same tp rank of the next stage, as torchtitan's stages do
// (parallel.Pipeline). The replicated tensors' gradients (norms, router,
// shared-expert gate) are partial sums over the tp group, all-reduced over
// it per unit after the stage's last backward of the step, before FSDP's
// reduction (parallel.TPReplicatedElements); the aux loss's gradient
// enters on tp rank 0 only, since every tp rank routes the same tokens.
//
// Expert parallelism inside a stage (ep > 1): EP borrows the stage's
// ranks as the single-program trainer's ranks do, on parallel.Mesh over
// StageLayout, the placement of torchtitan v0.2.2's sparse mesh
// (73a0e69, torchtitan/distributed/parallel_dims.py: (pp, dp_replicate,
// efsdp, ep, etp) unflattened from the world, efsdp = dp_shard·cp·tp /
// (etp·ep)). Without tp an EP group is ep consecutive dp_shard ranks and
// efsdp those ep apart. With tp at etp 1 EP borrows dp_shard × tp: the
// experts are whole, each tp rank dispatches the routed rows of its
// contiguous 1/tp of the gathered tokens (tpComm.splitRows, torchtitan's
// ReordererSequenceParallel), and when efsdp spans tp ranks (ep < tp) the
// efsdp reduction sums those ranks' expert gradients. With tp at etp =
// tp EP borrows dp_shard only: an EP group is the ranks of one tp index,
// each expert is split over tp like a dense FFN (ref.TPShard by the etp
// index) and every tp rank dispatches all the gathered tokens to its
// pieces; the reduce-scatter after the block sums the pieces' partial
// outputs. A rank holds the routed experts of EP index e, [e·E/ep,
// (e+1)·E/ep), of its stages' MoE layers (their etp pieces),
// FSDP-chunked over its efsdp group; those blocks
// route their rows through an epStage on the stage's EP group, one per
// micro-batch (each keeps its micro-batch's all-to-all counts and
// activations from forward to backward while others are in flight). The
// experts' gradients, the sum of every EP member's tokens routed to them,
// are reduce-scattered over efsdp, the other tensors' over dp_shard.
// Under zero-bubble schedules the experts' weight-gradient GEMMs are
// queued in the input pass like the blocks' (ref.Block.DeferWeightGrads
// hands the block's queue to its epStage) and run in the weight pass;
// both all-to-alls of the experts' backward stay in the input pass,
// which needs them for the input's gradient.
//
// Replicas inside a stage (HSDP, dp_replicate > 1): the stage's
// data-parallel ranks are dp_replicate × dp_shard, data-parallel rank
// replica·dp_shard + shard reading its micro-batches as above (DP =
// dp_replicate × dp_shard); each replica chunks the tensors over its own
// dp_shard (efsdp) group, and the reduce-scattered gradients are then
// all-reduced over the replicate group, once per step after the stage's
// last backward (the loads of the selection bias too), as the
// single-program trainer's HSDP does with its reduction.
//
// Not built here yet: other sharding modes inside a stage, and tied
// embeddings (the table would live on the first and the last stage).
type PipelineTrainer struct {
	spec  PipelineSpec
	batch parallel.Batch // the equivalent one-rank batch (see above)
	m     int            // pipeline micro-batches per micro-step
	dp    int            // data-parallel ranks per stage, dp_replicate × dp_shard
	tp    int            // tensor-parallel ranks per data-parallel rank
	ep    int            // expert-parallel ranks, borrowed from the stage's dp_shard
	el    int            // routed experts per EP rank
	lcfg  *moe.Config    // a tp rank's local shapes (ref.TPLocal; the config itself without tp)
	order [][]job.PipeAction
	split []int
	first []int               // first layer of each stage, then cfg.Layers
	ranks [][]*pipeRank       // [pipeline rank][stage rank: data-parallel rank × tp + tp rank]
	ux    *parallel.UnitIndex // the config's tensors by unit (read only)
	comms []*collective.Comm  // per pipeline rank, over its stage mesh
	step  int
}

// pipeRank is one (pipeline rank, stage rank)'s model and state.
type pipeRank struct {
	rank, d int // pipeline rank, data-parallel rank (replica·dp_shard + shard)
	replica int
	lane    int                 // its rank on the stage mesh, d·tp + tp rank: the neighbouring stages' rank it talks to
	coord   parallel.Coord      // its place on the stage mesh (tp, ep and etp indices)
	model   *ref.Model[float32] // every tensor (its tp pieces under tp); the rank uses its stages' only, gathered for the step
	owned   []bool              // per Params entry: held by this rank (its stages' tensors; of their routed experts, its EP index's)
	shard   [][]float32         // per owned tensor: this rank's chunk (the whole tensor without FSDP)
	group   []parallel.Group    // per owned tensor: the group its chunks span (dp_shard; efsdp for routed experts under ep)
	adam    []ref.AdamState[float32]
	stages  []int
}

// chunk is the length of one rank's chunk of n elements over k ranks.
func chunk(n, k int) int { return (n + k - 1) / k }

// NewPipelineTrainer checks spec and gives every pipeline rank the initial
// parameters init (moe.Config.Params order).
func NewPipelineTrainer(spec PipelineSpec, init [][]float32) (*PipelineTrainer, error) {
	if err := checkPipelineSpec(spec); err != nil {
		return nil, err
	}
	cfg, l := spec.Model, spec.Layout
	m, err := l.Microbatches(spec.LBS)
	if err != nil {
		return nil, err
	}
	order, err := job.PipelineOrder(l.PPSchedule, l.Stages(), l.VirtualStages(), m)
	if err != nil {
		return nil, err
	}
	split, err := l.StageSplit(cfg.Layers)
	if err != nil {
		return nil, err
	}
	ps := cfg.Params()
	if len(init) != len(ps) {
		return nil, fmt.Errorf("numeric: %d initial tensors, model has %d", len(init), len(ps))
	}
	if err := spec.Recipe.Resolve(); err != nil {
		return nil, fmt.Errorf("numeric: pipeline: %w", err)
	}
	spec.storage = spec.Storage()
	dp, tp := l.DP(), l.TPDegree()
	b := parallel.Batch{LBS: l.PPMicrobatchSize, Seq: spec.Seq, GradAccum: spec.GradAccum * dp * m, DP: 1}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	// A tp rank's tensors and block runners have its local shapes
	// (TPLocal; the same tensors in the same order as cfg's).
	lcfg := cfg
	if tp > 1 {
		lcfg = ref.TPLocal(cfg, tp, l.ExpertTP())
	}
	el := cfg.Experts / max(l.EP, 1)
	p := &PipelineTrainer{spec: spec, batch: b, m: m, dp: dp, tp: tp, ep: l.EP, el: el, lcfg: lcfg, order: order, split: split, ux: parallel.NewUnitIndex(cfg)}
	p.first = make([]int, len(split)+1)
	for s, n := range split {
		p.first[s+1] = p.first[s] + n
	}
	for i := range ps {
		if int64(len(init[i])) != ps[i].Elements() {
			return nil, fmt.Errorf("numeric: %s has %d elements, want %d", ps[i].Name, len(init[i]), ps[i].Elements())
		}
	}
	for r := range l.Stages() {
		if err := p.addStage(r, init); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// checkPipelineSpec refuses what the pipeline trainer cannot run: an
// invalid config or layout, fewer than two stages, what is not built
// inside a stage yet, a model or sequence length the layout cannot split.
func checkPipelineSpec(spec PipelineSpec) error {
	cfg, l := spec.Model, spec.Layout
	if cfg == nil {
		return errors.New("numeric: pipeline: config is required")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	switch {
	case l.Stages() < 2:
		return fmt.Errorf("numeric: pipeline: pp = %d: needs pp ≥ 2", l.PP)
	case l.DPShard > 1 && l.Sharding != job.ShardFSDP:
		// Only what dp_shard shards is unbuilt (replicas, tp and ep run
		// under fsdp); without a dp_shard axis the modes are the same.
		return fmt.Errorf("numeric: pipeline: sharding %s over dp_shard %d inside a pipeline stage: not built (built: fsdp); gpus %d = pp %d × dp_replicate %d × dp_shard %d × tp %d, ep %d, etp %d",
			l.Sharding, l.DPShard, l.GPUs, l.Stages(), l.DPReplicate, l.DPShard, l.TPDegree(), l.EP, max(l.ETP, 1))
	case cfg.TiedEmbeddings:
		return errors.New("numeric: pipeline: tied embeddings would live on the first and the last stage: not built")
	case spec.Seq < 1 || spec.GradAccum < 1:
		return fmt.Errorf("numeric: pipeline: seq = %d, grad_accum = %d: each must be ≥ 1", spec.Seq, spec.GradAccum)
	}
	if err := l.CheckModel(cfg); err != nil {
		return err
	}
	return l.CheckSeq(spec.Seq)
}

// stageOf is the stage that runs layer: the embedding's is the first, the
// head's the last.
func (p *PipelineTrainer) stageOf(layer int) int {
	switch {
	case layer == moe.LayerEmbed:
		return 0
	case layer == p.spec.Model.LayerHead():
		return len(p.split) - 1
	}
	for s := range p.split {
		if layer < p.first[s+1] {
			return s
		}
	}
	return len(p.split) - 1
}

// addStage makes pipeline rank r's communicator over its stage's mesh and
// a pipeRank on every lane of it.
func (p *PipelineTrainer) addStage(r int, init [][]float32) error {
	stage := p.spec.Layout.StageLayout()
	mesh, err := parallel.NewMesh(stage, p.spec.Model, stage.GPUs)
	if err != nil {
		return fmt.Errorf("numeric: pipeline: %w", err)
	}
	p.comms = append(p.comms, collective.New(mesh))
	var row []*pipeRank
	for lane := range stage.GPUs {
		pr, err := p.newPipeRank(mesh, r, lane, init)
		if err != nil {
			return err
		}
		row = append(row, pr)
	}
	p.ranks = append(p.ranks, row)
	return nil
}

// newPipeRank makes the rank on lane of pipeline rank r's stage mesh: its
// model holds its tp pieces of init, and it keeps its chunk of every
// tensor it owns.
func (p *PipelineTrainer) newPipeRank(mesh *parallel.Mesh, r, lane int, init [][]float32) (*pipeRank, error) {
	cfg, l := p.spec.Model, p.spec.Layout
	ps := cfg.Params()
	co := mesh.Coord(lane)
	mod, err := ref.NewModel[float32](p.lcfg)
	if err != nil {
		return nil, err
	}
	pr := &pipeRank{rank: r, d: co.Replica*l.DPShard + co.Shard, replica: co.Replica, lane: lane, coord: co, model: mod, owned: make([]bool, len(ps)), shard: make([][]float32, len(ps)),
		group: make([]parallel.Group, len(ps)), adam: make([]ref.AdamState[float32], len(ps))}
	pr.stages = l.RankStages(r)
	for i, t := range mod.Tensors() {
		// The routed experts are split over Layout.ExpertTP (tp
		// with ep = 1 or etp = tp, whole at etp = 1) by the etp
		// index, the rest over tp by the tp index.
		n, idx := tpSplit(mesh.Layout, co, ps[i])
		copy(t, ref.TPShard(ps[i], init[i], n, idx))
		layer := ps[i].Layer
		if layer < 0 {
			layer = cfg.LayerHead()
			if ps[i].Group == moe.GroupEmbedding {
				layer = moe.LayerEmbed
			}
		}
		pr.owned[i] = l.StageRank(p.stageOf(layer)) == r
		pr.group[i] = mesh.Group(parallel.AxisShard, lane)
		if l.EP > 1 && ps[i].Group == moe.GroupRouted {
			pr.owned[i] = pr.owned[i] && ps[i].Expert/p.el == co.EP
			pr.group[i] = mesh.Group(parallel.AxisEFSDP, lane)
		}
		g := pr.group[i]
		switch {
		case !pr.owned[i] || ps[i].Buffer:
		case g.Size() == 1: // without FSDP the chunk is the tensor
			pr.shard[i] = t
		default:
			c, d := chunk(len(t), g.Size()), g.IndexOf(lane)
			pr.shard[i] = make([]float32, c)
			copy(pr.shard[i], t[min(d*c, len(t)):min((d+1)*c, len(t))])
		}
	}
	return pr, nil
}

// pipeLinks are the channels of one micro-step: act[s][j] carries
// micro-batch j's output of stage s to stage s + 1, grad[s][j] the
// gradient of stage s's input back to stage s − 1.
type pipeLinks struct {
	act  [][]chan fwdMsg
	grad [][]chan bwdMsg
}

// fwdMsg is a micro-batch's activation with the aux loss's running
// totals: HF's per-expert counts and score sums over the layers so far
// (ref.AuxPartial), or, with SeqAuxLoss, the layers' losses so far.
type fwdMsg struct {
	x        []float32
	cnt, sum []float64
	aux      float64
}

// bwdMsg is the gradient of a stage's input with HF's aux gradient, the
// same for every MoE layer (ref.AuxFromTotals; nil without it).
type bwdMsg struct{ dx, auxGrad []float32 }

func newPipeLinks(stages, m int) *pipeLinks {
	k := &pipeLinks{act: make([][]chan fwdMsg, stages), grad: make([][]chan bwdMsg, stages)}
	for s := range stages {
		k.act[s], k.grad[s] = make([]chan fwdMsg, m), make([]chan bwdMsg, m)
		for j := range m {
			// One message each way per micro-batch: a buffer of one never
			// blocks the sender.
			k.act[s][j], k.grad[s][j] = make(chan fwdMsg, 1), make(chan bwdMsg, 1)
		}
	}
	return k
}

// pipeLinks of micro-step a for stage rank (lane) i.
func (p *PipelineTrainer) newLinks() [][]*pipeLinks {
	out := make([][]*pipeLinks, p.spec.GradAccum)
	for a := range out {
		for range p.dp * p.tp {
			out[a] = append(out[a], newPipeLinks(len(p.split), p.m))
		}
	}
	return out
}

// Step runs one optimizer step on every pipeline rank. The result's Loss
// and Aux are the means over the step's micro-batches of the
// cross-entropy and of the aux loss, Losses each micro-batch's
// cross-entropy in one rank's order.
func (p *PipelineTrainer) Step(ctx context.Context) (StepResult, error) {
	total := p.spec.GradAccum * p.dp * p.m
	losses, auxes := make([]float64, total), make([]float64, total)
	errs := make([]error, len(p.ranks))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	links := p.newLinks()
	var wg sync.WaitGroup
	for r := range p.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A stage's data-parallel ranks run on its communicator; an
			// error anywhere cancels every stage (a neighbour waiting on a
			// message included).
			errs[r] = p.comms[r].Run(ctx, func(ctx context.Context, ep *collective.Endpoint) error {
				return p.runRank(ctx, ep, p.ranks[r][ep.Rank()], losses, auxes, links)
			})
			if errs[r] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	res := StepResult{Step: p.step, Losses: losses, Tokens: int64(p.spec.LBS) * int64(p.spec.Seq) * int64(p.spec.GradAccum)} // one data-parallel rank's
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	for k := range losses {
		res.Loss += losses[k]
		res.Aux += auxes[k]
	}
	res.Loss /= float64(total)
	res.Aux /= float64(total)
	p.step++
	if math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0) {
		return res, fmt.Errorf("step %d: loss %v: training diverged", res.Step+1, res.Loss)
	}
	return res, nil
}

// Params reassembles the parameters (Config.Params order), each tensor
// from the ranks of replica 0 that hold it: its tp pieces (etp pieces for
// a routed expert; the FSDP chunks of each piece, in the chunk group's
// order, which is the lanes', padding dropped) put back in place; a
// routed expert under ep from its EP index's ranks.
func (p *PipelineTrainer) Params() [][]float32 {
	cfg, stage := p.spec.Model, p.spec.Layout.StageLayout()
	ps := cfg.Params()
	out := make([][]float32, len(ps))
	for _, row := range p.ranks {
		for i := range ps {
			var holders []*pipeRank
			for _, pr := range row {
				if pr.owned[i] && pr.replica == 0 { // replicas hold the same chunks
					holders = append(holders, pr)
				}
			}
			switch {
			case len(holders) == 0:
			case ps[i].Buffer: // the selection bias: every rank's copy is the same
				out[i] = append([]float32(nil), holders[0].model.Tensors()[i]...)
			default:
				n := len(holders[0].model.Tensors()[i])
				out[i] = make([]float32, ps[i].Elements())
				deg, _ := tpSplit(stage, holders[0].coord, ps[i])
				for j := range deg {
					var piece []float32
					for _, pr := range holders {
						if _, idx := tpSplit(stage, pr.coord, ps[i]); idx == j {
							piece = append(piece, pr.shard[i]...)
						}
					}
					ref.TPUnshard(ps[i], piece[:n], out[i], deg, j, false)
				}
			}
		}
	}
	return out
}
