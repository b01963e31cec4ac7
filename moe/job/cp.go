package job

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Context parallelism (CP) splits every sequence of a data-parallel rank
// over cp ranks: each holds seq/cp of its tokens (and of every activation
// and of the loss) and attention exchanges keys and values between them.
// The mesh is torchtitan's (v0.2.2 73a0e6979dd1,
// torchtitan/distributed/parallel_dims.py): world = pp × dp_replicate ×
// dp_shard × cp × tp, cp between dp_shard and tp; FSDP shards over the
// flattened dp_shard × cp ("fsdp": dp_shard·cp), EP borrows from it
// (efsdp = dp_shard·cp·tp/(ep·etp)), the loss is reduced over
// dp_replicate × dp_shard × cp, and seq_len must divide by tp·(2·cp)
// (seq_len_divisor: the load balancer's halves).

// CPMethod is how the cp ranks exchange keys and values.
type CPMethod string

// Context-parallel methods, by their frameworks' names.
const (
	// CPAllGather all-gathers every rank's K/V shards before attention
	// and reduce-scatters dK/dV after its backward: torchtitan v0.2.2's
	// context_parallel_rotate_method "allgather" (its default,
	// torchtitan/config/job_config.py) and Megatron-Core's --cp-comm-type
	// allgather (TransformerEngine's "all_gather").
	CPAllGather CPMethod = "allgather"
	// CPAllToAll rotates the K/V shards one hop per attention block by
	// all-to-all: torchtitan v0.2.2's rotate method "alltoall".
	CPAllToAll CPMethod = "alltoall"
	// CPP2P is a ring: cp−1 send/receive steps of K/V, each overlapped
	// with the attention block of the shard already held (backward: the
	// dK/dV ring): Megatron-Core's default --cp-comm-type p2p
	// (Megatron-LM d98e8a64 megatron/training/arguments.py).
	CPP2P CPMethod = "p2p"
	// CPA2A and CPA2AP2P are Megatron-Core's Ulysses-style all-to-all and
	// its hierarchical mix: refused by name (not modelled yet).
	CPA2A    CPMethod = "a2a"
	CPA2AP2P CPMethod = "a2a+p2p"
)

// Values lists every method DESIGN names, the refused ones included.
func (CPMethod) Values() []string {
	return []string{string(CPAllGather), string(CPAllToAll), string(CPP2P), string(CPA2A), string(CPA2AP2P)}
}

// Ring says the method moves K/V one hop per attention block (cp−1
// steps), each overlapped with the block of the shard already held.
func (m CPMethod) Ring() bool { return m == CPAllToAll || m == CPP2P }

// CPLoadBalancer is how a sequence's tokens are dealt to the cp ranks.
type CPLoadBalancer string

// Load balancers: torchtitan's context_parallel_load_balancer (v0.2.2
// 73a0e6979dd1 and main b5bcd76c66d0, default "headtail"; None disables
// it, written "none" here).
const (
	// CPHeadTail cuts the sequence into 2·cp chunks and gives rank i
	// chunks i and 2·cp−1−i, so that every rank sees the same share of a
	// causal mask (PyTorch's _HeadTailLoadBalancer, for SDPA).
	CPHeadTail CPLoadBalancer = "headtail"
	// CPPTRR is torchtitan's PTRRLoadBalancer for FlexAttention block
	// masks: balanced like headtail for a causal mask.
	CPPTRR CPLoadBalancer = "ptrr"
	// CPNoBalance gives rank i the i-th contiguous seq/cp tokens: the
	// last rank's queries see the most keys under a causal mask.
	CPNoBalance CPLoadBalancer = "none"
)

// Values lists the load balancers.
func (CPLoadBalancer) Values() []string {
	return []string{string(CPHeadTail), string(CPPTRR), string(CPNoBalance)}
}

// CPDegree is the context-parallel degree (CP, with 0 read as 1).
func (l Layout) CPDegree() int { return max(l.CP, 1) }

// resolveCP fills the CP options' defaults when cp > 1 (torchtitan's
// rotate method allgather and load balancer headtail); cp = 1 is written
// 0 (absent from JSON, one key for the planner's maps).
func (l *Layout) resolveCP() {
	if l.CPDegree() == 1 {
		l.CP = 0
		return
	}
	if l.CPMethod == "" {
		l.CPMethod = CPAllGather
	}
	if l.CPLoadBalancer == "" {
		l.CPLoadBalancer = CPHeadTail
	}
}

// validateCP checks the CP options: a method or balancer not modelled is
// refused by name.
func (l Layout) validateCP() []error {
	var errs []error
	switch l.CPMethod {
	case "", CPAllGather, CPAllToAll, CPP2P:
	case CPA2A, CPA2AP2P:
		errs = append(errs, moe.FieldError{Field: "cp_method", Value: l.CPMethod, Allowed: "Megatron-Core's all-to-all context parallelism is not modelled yet (allgather, alltoall and p2p are)"})
	default:
		errs = append(errs, moe.FieldError{Field: "cp_method", Value: l.CPMethod, Allowed: "must be allgather, alltoall, p2p, a2a or a2a+p2p"})
	}
	switch l.CPLoadBalancer {
	case "", CPHeadTail, CPPTRR, CPNoBalance:
	default:
		errs = append(errs, moe.FieldError{Field: "cp_load_balancer", Value: l.CPLoadBalancer, Allowed: "must be headtail, ptrr or none"})
	}
	if l.CPDegree() == 1 && (l.CPMethod != "" || l.CPLoadBalancer != "") && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("cp_method = %q, cp_load_balancer = %q: need cp > 1", l.CPMethod, l.CPLoadBalancer))
	}
	return errs
}

// CPAttentionShare is the fraction of a sequence's causal attention the
// most loaded cp rank computes: 1/cp with a load balancer; without one
// the last rank's m = seq/cp queries each see every earlier chunk and its
// own causal block, (m·(cp−1)·m + m(m+1)/2) of the seq(seq+1)/2 entries.
func (l Layout) CPAttentionShare(seq int) float64 {
	cp := l.CPDegree()
	if cp == 1 {
		return 1
	}
	if l.CPLoadBalancer != CPNoBalance {
		return 1 / float64(cp)
	}
	m, s := float64(seq)/float64(cp), float64(seq)
	return (m*float64(cp-1)*m + m*(m+1)/2) / (s * (s + 1) / 2)
}

// FoldCP is the run as one cp rank computes everything but attention: a
// layout with cp folded into dp_shard (torchtitan's fsdp mesh dp_shard·cp,
// from which EP borrows; the ranks' numbering is unchanged since cp sits
// just outside tp) and sequences of seq/cp tokens. Every rank then holds
// the same tokens, weights, gradients and activations as under CP, and the
// global batch in tokens is unchanged; attention's keys and values span
// the whole sequence (CPAttentionShare) and are exchanged (the
// simulator's CP collectives). The spec itself when cp = 1.
func (s Spec) FoldCP() Spec {
	cp := s.CPDegree()
	s.Layout = s.Layout.FoldCP()
	s.Seq /= cp
	return s
}

// FoldCP is the layout with cp folded into dp_shard (Spec.FoldCP); l
// itself when cp = 1.
func (l Layout) FoldCP() Layout {
	l.DPShard *= l.CPDegree()
	l.CP, l.CPMethod, l.CPLoadBalancer = 0, "", ""
	return l
}

// checkCPSeq checks that seq splits over the cp ranks as the load
// balancer deals it: seq divisible by tp·2·cp (torchtitan's
// seq_len_divisor); without a balancer by tp·cp.
func (l Layout) checkCPSeq(seq int) error {
	tp, cp := l.TPDegree(), l.CPDegree()
	chunks := 2 * cp
	if l.CPLoadBalancer == CPNoBalance {
		chunks = cp
	}
	if tp == 1 && cp == 1 {
		return nil
	}
	if seq%(tp*chunks) != 0 {
		return fmt.Errorf("seq = %d is not divisible by tp × %d·cp = %d × %d = %d (torchtitan's seq_len_divisor: sequence parallelism and the load balancer's chunks; cp = %d, cp_load_balancer %s)",
			seq, chunks/cp, tp, chunks, tp*chunks, cp, l.CPLoadBalancer)
	}
	return nil
}
