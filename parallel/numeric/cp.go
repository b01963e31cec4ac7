package numeric

import (
	"context"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// CP is the run's context parallelism as the goroutine ranks execute it.
// The Trainer's mesh is then the layout with cp folded into dp_shard
// (job.Layout.FoldCP: torchtitan's fsdp mesh dp_shard·cp, from which EP
// borrows; cp sits just outside tp, so cp consecutive shard indices form
// one cp group): FSDP and EP run over the folded axis unchanged, and the
// cp ranks of a group read their data-parallel rank's sequences, each its
// shard of every sequence (Positions), attention exchanging keys and
// values between them (cpAttention).
type CP struct {
	Degree   int // cp; 0 or 1 = none
	Method   job.CPMethod
	Balancer job.CPLoadBalancer
}

// degree is the cp degree, 0 read as 1.
func (c CP) degree() int { return max(c.Degree, 1) }

// axisCP names the groups of the cp ranks that share the sequences of one
// data-parallel rank (the folded mesh has no such axis of its own).
const axisCP parallel.Axis = "cp"

// check refuses what the numeric CP ranks do not run, by name.
func (c CP) check(cfg *moe.Config, l job.Layout, seq int) error {
	cp := c.degree()
	if cp == 1 {
		return nil
	}
	var why string
	switch {
	case l.TPDegree() > 1:
		why = fmt.Sprintf("tp = %d: numeric CP ranks with tensor parallelism are not built (simulate and plan price them)", l.TPDegree())
	case l.DPShard%cp != 0:
		why = fmt.Sprintf("the mesh's dp_shard = %d is not dp_shard × cp (job.Layout.FoldCP)", l.DPShard)
	case c.Method != job.CPAllGather && !c.Method.Ring():
		why = fmt.Sprintf("cp_method = %q: the numeric ranks run allgather, alltoall and p2p", c.Method)
	case c.Balancer == job.CPPTRR:
		why = "cp_load_balancer = ptrr: FlexAttention's block assignment is not built in the numeric ranks (headtail and none are)"
	case c.Balancer != job.CPHeadTail && c.Balancer != job.CPNoBalance:
		why = fmt.Sprintf("cp_load_balancer = %q: must be headtail or none", c.Balancer)
	case c.layout().CheckSeq(seq) != nil:
		why = c.layout().CheckSeq(seq).Error()
	case cfg.IsMLA():
		why = "multi-head latent attention: the ring exchanges standard K/V heads only (not built)"
	case cfg.AttnSinks:
		why = "attn_sinks: context-parallel attention with sinks is not built"
	case cfg.SeqAuxLoss:
		why = "seq_aux_loss: the per-sequence aux loss across cp shards is not built"
	}
	for l, w := range cfg.Window {
		if why == "" && w != 0 {
			why = fmt.Sprintf("layer %d has a sliding window of %d: context-parallel sliding-window attention is not built", l, w)
		}
	}
	if why != "" {
		return fmt.Errorf("numeric: cp = %d: %s", cp, why)
	}
	return nil
}

// chunks is how many equal pieces the balancer cuts a sequence into.
func (c CP) chunks() int {
	if c.Balancer == job.CPNoBalance {
		return c.degree()
	}
	return 2 * c.degree()
}

// layout is the cp part of a layout, whose CheckSeq is the one rule on
// how sequences split.
func (c CP) layout() job.Layout {
	return job.Layout{CP: c.Degree, CPMethod: c.Method, CPLoadBalancer: c.Balancer}
}

// Positions returns the indices in a sequence of seq tokens of the tokens
// cp rank i holds, ascending: under headtail chunks i and 2·cp−1−i of
// 2·cp equal chunks (PyTorch's _HeadTailLoadBalancer, which torchtitan
// v0.2.2 73a0e69 selects by context_parallel_load_balancer "headtail"),
// under none the i-th of cp contiguous pieces.
func (c CP) Positions(seq, i int) []int {
	cp := c.degree()
	n := seq / c.chunks()
	var chunks []int
	if c.Balancer == job.CPNoBalance {
		chunks = []int{i}
	} else {
		chunks = []int{i, 2*cp - 1 - i}
	}
	var pos []int
	for _, ch := range chunks {
		for p := ch * n; p < (ch+1)*n; p++ {
			pos = append(pos, p)
		}
	}
	return pos
}

// cpGroup is rank's cp group in the folded mesh m: the cp ranks of its
// replica whose folded shard indices s share s / cp (cp is the inner
// factor of dp_shard·cp, torchtitan's mesh order), in increasing order.
func cpGroup(m *parallel.Mesh, rank, cp int) parallel.Group {
	c := m.Coord(rank)
	first := c.Replica*m.Layout.DPShard + c.Shard/cp*cp // folded data-parallel rank of member 0 (tp = 1)
	g := parallel.Group{Axis: axisCP, Index: first / cp}
	for i := 0; i < cp; i++ {
		g.Ranks = append(g.Ranks, first+i)
	}
	return g
}

// shardTokens takes from ids and labels [B·seq] the tokens at pos of every
// sequence: [B·len(pos)], sequence-major as the block reads them.
func shardTokens(ids, labels []int, seq int, pos []int) (sid, slab []int) {
	B := len(ids) / seq
	for b := 0; b < B; b++ {
		for _, p := range pos {
			sid, slab = append(sid, ids[b*seq+p]), append(slab, labels[b*seq+p])
		}
	}
	return sid, slab
}

// cpAuxLoss is HF's load-balancing loss of the micro-batch whose
// sequences the rank's cp group shares: the per-expert counts and score
// sums of every member's tokens are summed over the group (as
// Megatron-Core reduces tokens_per_expert over its tp_cp group before the
// aux loss: Megatron-LM d98e8a64 megatron/core/transformer/moe/router.py,
// TopKRouter's aux-loss path) — gathered as float64 words and summed in
// member order, so every member holds the same totals. Each member's
// gradient then covers its own rows, coef·E·c_e/N² at the whole
// sequences' N, and joins the sum over the cp group once: scale·cp (the
// cross-entropy's scale divides by cp because its means are the shards').
func (r *numRank) cpAuxLoss(ctx context.Context, ep *collective.Endpoint, scale float64) (float64, [][]float32, error) {
	cfg, E := r.cfg, r.cfg.Experts
	cnt, sum := make([]float64, E), make([]float64, E)
	ref.AuxPartial(r.blocks, cnt, sum)
	var words []float32
	for _, x := range append(cnt, sum...) {
		words = append(words, f64Words(x)...)
	}
	all, err := ep.AllGather(ctx, r.cp.group, moe.F32, words)
	if err != nil {
		return 0, nil, err
	}
	tot := make([]float64, 2*E)
	for j := 0; j < r.cp.group.Size(); j++ {
		for i := range tot {
			tot[i] += wordsF64(all[(j*2*E+i)*2:][:2])
		}
	}
	cp := r.spec.CP.degree()
	aux, g := ref.AuxFromTotals[float32](cfg, r.spec.Batch.LBS, r.spec.Batch.Seq, tot[:E], tot[E:], scale*float64(cp)*r.spec.AuxCoef)
	grad := make([][]float32, cfg.Layers)
	for l := range grad {
		if cfg.MoELayer[l] {
			grad[l] = g
		}
	}
	return aux, grad, nil
}
