package sim

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Context parallelism in virtual time. A cp rank runs the layout with cp
// folded into dp_shard at seq/cp tokens per sequence (job.Spec.FoldCP:
// its weights, gradients, FSDP collectives, experts and every op but
// attention), and its attention differs in two ways, priced here:
//   - its queries see keys of the whole sequence: the attention ops count
//     the most loaded rank's share of the full sequence's causal mask
//     (job.Layout.CPAttentionShare; 1/cp with a load balancer);
//   - the K/V shards are exchanged over the cp group (cp consecutive
//     blocks of tp ranks: NVLink or the network by placement), as each
//     method does (cpExchange.forward, backward).
//
// The exchange runs inside the attention it feeds, so its exposed part is
// charged inside the compute op holding that attention and named in the
// breakdown by collective (cpColls); the whole exchange time is in
// comm_s under the same names.

// The CP collectives, by breakdown name.
const (
	cpAllGatherKV    = iota // all-gather of K/V before attention (forward and backward)
	cpReduceScatterD        // reduce-scatter of dK/dV after attention's backward
	cpRingKV                // ring (p2p or all-to-all rotation) of K/V shards
	cpRingDKV               // ring of dK/dV shards in backward
	numCPColls
)

var cpCollNames = [numCPColls]string{"cp_all_gather_kv", "cp_reduce_scatter_dkv", "cp_ring_kv", "cp_ring_dkv"}

// cpCharge is the CP exchange inside one compute op: total seconds each
// collective ran and the part of it the attention could not hide.
type cpCharge struct {
	total, exposed [numCPColls]float64
}

func (c *cpCharge) add(o cpCharge) {
	for k := range c.total {
		c.total[k] += o.total[k]
		c.exposed[k] += o.exposed[k]
	}
}

func (c cpCharge) exposedSum() float64 {
	s := 0.0
	for _, v := range c.exposed {
		s += v
	}
	return s
}

// cpExchange is how one cp rank exchanges K/V; the zero value (cp = 1)
// exchanges nothing.
type cpExchange struct {
	cp     int
	method job.CPMethod
	cl     *hw.Cluster
	group  cost.GroupShape
	link   hw.LinkClass // the ring's slowest hop
	shard  float64      // bytes of one rank's K and V shard per micro-step and layer
}

// newCPExchange places the cp group of rank 0 (ranks 0, tp, …, (cp−1)·tp:
// cp sits just outside tp in the mesh) on the cluster; shard is one rank's
// K and V per layer: lbs·seq/cp tokens × kv_heads/tp × head_dim × 2, in
// the activation type.
func newCPExchange(s job.Spec, cl *hw.Cluster) cpExchange {
	cp := s.CPDegree()
	if cp == 1 {
		return cpExchange{}
	}
	tp := s.TPDegree()
	ranks := make([]int, cp)
	for i := range ranks {
		ranks[i] = i * tp
	}
	tokens := float64(s.LBS) * float64(s.Seq/cp)
	kv := tokens * float64(s.Model.KVHeads/tp) * float64(s.Model.HeadDim) * 2 * float64(s.Storage().Activation.Bytes())
	return cpExchange{cp: cp, method: s.CPMethod, cl: cl, group: cost.ShapeOf(cl, ranks), link: cl.Link(ranks[0], ranks[cp-1]), shard: kv}
}

// forward is the exchange of one layer's attention forward taking attn
// seconds on this rank.
//   - allgather: one all-gather of the cp shards, overlapped with the
//     first sub-attention over the rank's own shard (torchtitan v0.2.2
//     73a0e69 job_config.py: "all-gather all kv shards on ranks after the
//     first sub-SDPA computation"), a 1/cp part of attn;
//   - ring (p2p, alltoall): cp−1 hops of one shard, hop i overlapped with
//     the attention block of the shard received at hop i−1 (TE d0067d0da
//     context_parallel.py AttnFuncWithCPAndKVP2P.forward; PyTorch's
//     alltoall rotater moves the same shard per step), attn/cp each.
func (x cpExchange) forward(cal *cost.Calibration, attn float64) (cpCharge, error) {
	var c cpCharge
	cl := x.cl
	if x.cp <= 1 {
		return c, nil
	}
	block := attn / float64(x.cp)
	if !x.method.Ring() {
		ag, err := cost.Collective(cl, cal, parallel.CollAllGather, x.group, x.shard*float64(x.cp))
		if err != nil {
			return c, err
		}
		t := ag.LatencyS + ag.BandwidthS
		c.total[cpAllGatherKV], c.exposed[cpAllGatherKV] = t, math.Max(0, t-block)
		return c, nil
	}
	hop := cost.P2PSeconds(cl, cal, x.link, x.shard)
	c.total[cpRingKV] = float64(x.cp-1) * hop
	c.exposed[cpRingKV] = float64(x.cp-1) * math.Max(0, hop-block)
	return c, nil
}

// backward is the exchange of one layer's attention backward taking attn
// seconds on this rank.
//   - allgather: the K/V all-gathered again before the backward (TE
//     AttnFuncWithCPAndKVAllGather.backward re-gathers k_ag, v_ag),
//     overlapped with the rank's own block, and the dK/dV reduce-scattered
//     after it, exposed;
//   - ring: cp−1 hops each moving a K/V shard and a dK/dV shard, each
//     overlapped with a block's backward (AttnFuncWithCPAndKVP2P.backward:
//     kv and dkv sent and received per step), and the last dK/dV hop back
//     to its owner after the last block, exposed.
func (x cpExchange) backward(cal *cost.Calibration, attn float64) (cpCharge, error) {
	var c cpCharge
	cl := x.cl
	if x.cp <= 1 {
		return c, nil
	}
	block := attn / float64(x.cp)
	full := x.shard * float64(x.cp)
	if !x.method.Ring() {
		ag, err := cost.Collective(cl, cal, parallel.CollAllGather, x.group, full)
		if err != nil {
			return c, err
		}
		rs, err := cost.Collective(cl, cal, parallel.CollReduceScatter, x.group, full)
		if err != nil {
			return c, err
		}
		t := ag.LatencyS + ag.BandwidthS
		c.total[cpAllGatherKV], c.exposed[cpAllGatherKV] = t, math.Max(0, t-block)
		r := rs.LatencyS + rs.BandwidthS
		c.total[cpReduceScatterD], c.exposed[cpReduceScatterD] = r, r
		return c, nil
	}
	kv := cost.P2PSeconds(cl, cal, x.link, x.shard)
	dkv := cost.P2PSeconds(cl, cal, x.link, x.shard)
	steps := float64(x.cp - 1)
	c.total[cpRingKV], c.total[cpRingDKV] = steps*kv, steps*dkv+dkv
	// A step's two transfers run together; what the block does not hide
	// is charged to each in proportion.
	if over := math.Max(0, math.Max(kv, dkv)-block); over > 0 {
		c.exposed[cpRingKV] = steps * over * kv / (kv + dkv)
		c.exposed[cpRingDKV] = steps * over * dkv / (kv + dkv)
	}
	c.exposed[cpRingDKV] += dkv
	return c, nil
}

// cpAttention sets the attention records of recs (one cp rank's ops at
// m = seq/cp tokens) to the rank's part of the whole sequence's: full
// holds the same ops at the whole sequence s (tpOps at seq), share is
// job.Layout.CPAttentionShare. A record counts a·(mask entries) + b·(its
// tokens) (flops' hardware count: the causal entries and the flash tiles'
// waste on the diagonal, linear in the tokens); the rank computes share of
// the whole mask's entries and the diagonal blocks of its own m tokens, so
// a and b are solved from the two counts (s(s+1)/2 and m(m+1)/2 entries)
// and the rank's count is a·share·s(s+1)/2 + b·m. Matched by layer, op
// and pass.
func cpAttention(recs, full []moe.OpRecord, seq, cp int, share float64) ([]moe.OpRecord, error) {
	type key struct {
		layer int
		op    moe.Op
		pass  moe.Pass
	}
	whole := map[key]int64{}
	for _, r := range full {
		if r.Op == moe.OpAttn {
			whole[key{r.Layer, r.Op, r.Pass}] += r.Count
		}
	}
	out := append([]moe.OpRecord(nil), recs...)
	for i, r := range out {
		if r.Op != moe.OpAttn {
			continue
		}
		w, ok := whole[key{r.Layer, r.Op, r.Pass}]
		if !ok {
			return nil, fmt.Errorf("simulate: cp: no whole-sequence attention record for layer %d %s", r.Layer, r.Pass)
		}
		s, m := float64(seq), float64(seq/cp)
		a := 2 * (float64(w)/s - float64(r.Count)/m) / (s - m)
		b := float64(r.Count)/m - a*(m+1)/2
		out[i].Count = int64(math.Round(a*share*s*(s+1)/2 + b*m))
	}
	return out, nil
}

// cpOps is tpOps for one cp rank of s (s unfolded): the folded run's ops
// with attention over the whole sequence (cpAttention).
func cpOps(s job.Spec, folded job.Spec) ([]moe.OpRecord, error) {
	recs, err := tpOps(s.Model, folded.Layout, flops.Shape{Seq: folded.Seq, Batch: folded.LBS}, s.AC)
	if err != nil || s.CPDegree() == 1 {
		return recs, err
	}
	full, err := tpOps(s.Model, folded.Layout, flops.Shape{Seq: s.Seq, Batch: s.LBS}, s.AC)
	if err != nil {
		return nil, err
	}
	return cpAttention(recs, full, s.Seq, s.CPDegree(), s.CPAttentionShare(s.Seq))
}

// chargeCP adds the exchange of attention record r, priced t seconds, to
// the compute ops holding it: forward (and its recompute when the block is
// re-run) or backward.
func chargeCP(costs *segCosts, in Input, r moe.OpRecord, seg parallel.Segment, t float64, reRun bool) error {
	if in.cp.cp <= 1 || r.Op != moe.OpAttn {
		return nil
	}
	var phases []parallel.Phase
	price := in.cp.forward
	switch r.Pass {
	case moe.Forward:
		phases = []parallel.Phase{parallel.PhaseForward}
		if reRun {
			phases = append(phases, parallel.PhaseRecompute)
		}
	case moe.BackwardData:
		phases, price = []parallel.Phase{parallel.PhaseBackward}, in.cp.backward
	default:
		return nil
	}
	ch, err := price(in.Calibration, t)
	if err != nil {
		return fmt.Errorf("simulate: cp: %w", err)
	}
	for _, ph := range phases {
		c := costs.at(segKey{r.Layer, seg, ph})
		c.cp.add(ch)
		c.total += ch.exposedSum()
	}
	return nil
}

// chargeCP charges the exposed context-parallel exchange inside compute
// op i (span d seconds) to exposed communication under each collective's
// name, and returns the seconds charged.
func (c *stepCharges) chargeCP(i int, d float64) float64 {
	if c.sim.cp == nil {
		return 0
	}
	charged := 0.0
	for k, v := range c.sim.cp[i].exposed {
		v = math.Min(v, d-charged)
		if v <= 0 {
			continue
		}
		c.b.ExposedCommS[cpCollNames[k]] += v
		c.detail[fmt.Sprintf("%s (cp, %s)", cpCollNames[k], c.sim.cpLink)] += v
		charged += v
	}
	return charged
}
