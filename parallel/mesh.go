package parallel

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Axis names one dimension of the device mesh (DESIGN.md, Layout contract).
//
// The dense mesh is (dp_replicate, dp_shard, tp), tp innermost; the expert
// mesh splits dp_shard × tp into (efsdp, ep, etp) with etp the innermost
// axis and ep the next, as torchtitan v0.2.2 unflattens its sparse mesh
// (efsdp = dp_shard·tp/(ep·etp), etp = Layout.ExpertTP()), so without tp an
// EP group is ep consecutive ranks.
type Axis string

// Mesh axes. Each names a family of groups that partition the world.
const (
	// AxisReplicate: ranks holding the same shard in different replicas
	// (HSDP gradient all-reduce); dp_replicate members.
	AxisReplicate Axis = "dp_replicate"
	// AxisShard: the ranks of one replica (FSDP/ZeRO sharding of dense
	// weights); dp_shard members.
	AxisShard Axis = "dp_shard"
	// AxisEP: ranks exchanging tokens by all-to-all; ep consecutive members.
	AxisEP Axis = "ep"
	// AxisEFSDP: ranks sharding the same experts (FSDP over dp_shard/ep);
	// members are ep apart.
	AxisEFSDP Axis = "efsdp"
	// AxisDP: every rank (the data-parallel group: loss and bias-load reductions).
	AxisDP Axis = "dp"
	// AxisTP: the tp consecutive ranks of one tensor-parallel group
	// (sequence-parallel all-gathers and reduce-scatters; with etp = tp
	// also the routed experts' split).
	AxisTP Axis = "tp"
)

// MeshAxes lists the axes in report order.
func MeshAxes() [6]Axis {
	return [...]Axis{AxisReplicate, AxisShard, AxisEP, AxisEFSDP, AxisDP, AxisTP}
}

// Mesh places world = dp_replicate × dp_shard × tp ranks. Rank r has tp
// index t = r mod tp, data-parallel rank d = r / tp, replica d / dp_shard and
// shard s = d mod dp_shard; in the expert mesh s·tp + t = (f·ep + e)·x + j with
// x = Layout.ExpertTP(), f its efsdp index, e its ep index and j its etp
// index. Rank r sits on node r / GPUsPerNode as local GPU r mod GPUsPerNode.
type Mesh struct {
	Layout      job.Layout
	GPUsPerNode int
}

// Coord is one rank's position in both meshes and on the machines.
type Coord struct {
	Rank    int
	Replica int // 0 ≤ Replica < dp_replicate
	Shard   int // 0 ≤ Shard < dp_shard; data-parallel rank = Replica·dp_shard + Shard = Rank / tp
	EFSDP   int // (Shard·tp + TP) / (ep·etp); Shard / ep without tp
	EP      int // ((Shard·tp + TP) / etp) mod ep; Shard mod ep without tp
	TP      int // Rank mod tp
	Node    int // Rank / gpus_per_node
	Local   int // Rank mod gpus_per_node
}

// DPRank is the rank's data-parallel index, Replica·dp_shard + Shard: the
// index the batch plan gives its sequences by (the tp ranks of one group
// read the same sequences).
func (c Coord) DPRank(l job.Layout) int { return c.Replica*l.DPShard + c.Shard }

// NewMesh validates a resolved layout (and, when cfg is not nil, that ep
// divides the experts) and places its ranks, gpusPerNode per node. Every
// failing constraint is reported with all the factors involved.
func NewMesh(l job.Layout, cfg *moe.Config, gpusPerNode int) (*Mesh, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	if cp := l.CPDegree(); cp > 1 {
		// cp sits between dp_shard and tp, so the ranks of the layout with
		// cp folded into dp_shard (torchtitan's flattened fsdp mesh
		// dp_shard·cp) are numbered as the CP layout's; the CP groups
		// themselves (cp consecutive blocks of tp ranks) carry no
		// collective of the schedule yet.
		return nil, fmt.Errorf("mesh: cp = %d: a mesh places the ranks of the layout with cp folded into dp_shard (job.Spec.FoldCP: dp_shard %d × cp %d = %d); numeric CP ranks are not built yet", cp, l.DPShard, cp, l.DPShard*cp)
	}
	if l.Stages() > 1 {
		// The mesh's coordinates and groups are those of one stage;
		// BuildPipeline places the stages (pp outermost).
		return nil, fmt.Errorf("mesh: pp = %d: a mesh places one pipeline stage's ranks (job.Layout.StageLayout: gpus %d = dp_replicate %d × dp_shard %d); pipelines are built by BuildPipeline", l.PP, l.DP(), l.DPReplicate, l.DPShard)
	}
	var errs []error
	if cfg != nil {
		if err := l.CheckModel(cfg); err != nil {
			errs = append(errs, fmt.Errorf("%w (experts per ep rank would not be whole; gpus = %d = dp_replicate %d × dp_shard %d, dp_shard = efsdp %d × ep %d)",
				err, l.GPUs, l.DPReplicate, l.DPShard, l.ExpertShard(), l.EP))
		}
	}
	if gpusPerNode < 1 || gpusPerNode > 1<<20 {
		errs = append(errs, moe.FieldError{Field: "gpus_per_node", Value: gpusPerNode, Allowed: "must be in [1, 1048576]"})
	} else if l.GPUs > gpusPerNode && l.GPUs%gpusPerNode != 0 {
		errs = append(errs, fmt.Errorf("gpus_per_node = %d does not divide gpus = %d (= dp_replicate %d × dp_shard %d × tp %d); a job spanning nodes fills whole nodes",
			gpusPerNode, l.GPUs, l.DPReplicate, l.DPShard, l.TPDegree()))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("mesh: %w", errors.Join(errs...))
	}
	return &Mesh{Layout: l, GPUsPerNode: gpusPerNode}, nil
}

// World is the number of ranks, dp_replicate × dp_shard × tp.
func (m *Mesh) World() int { return m.Layout.GPUs }

// Nodes is the number of nodes the ranks occupy (the last may be partly used
// when the whole job fits in one node).
func (m *Mesh) Nodes() int { return (m.World() + m.GPUsPerNode - 1) / m.GPUsPerNode }

// Coord returns rank's coordinates; rank must be in [0, World).
func (m *Mesh) Coord(rank int) Coord {
	l := m.Layout
	tp, x := l.TPDegree(), l.ExpertTP()
	d := rank / tp
	s := d % l.DPShard
	flat := s*tp + rank%tp // position in the replica's dp_shard × tp
	return Coord{
		Rank: rank, Replica: d / l.DPShard, Shard: s, EFSDP: flat / (x * l.EP), EP: flat / x % l.EP, TP: rank % tp,
		Node: rank / m.GPUsPerNode, Local: rank % m.GPUsPerNode,
	}
}

// Node returns the node rank runs on.
func (m *Mesh) Node(rank int) int { return rank / m.GPUsPerNode }

// Group is one communicator: the ranks of one axis that share every other
// coordinate, in increasing rank order (the order of gathered chunks, of
// reduce-scatter shards and of every reduction).
type Group struct {
	Axis  Axis
	Index int   // which group of the axis, 0 ≤ Index < number of groups of the axis
	Ranks []int // members, increasing
}

// Name identifies the group, e.g. "ep[1]".
func (g Group) Name() string { return fmt.Sprintf("%s[%d]", g.Axis, g.Index) }

// Size is the number of members.
func (g Group) Size() int { return len(g.Ranks) }

// IndexOf returns rank's position in the group, or -1.
func (g Group) IndexOf(rank int) int {
	for i, r := range g.Ranks {
		if r == rank {
			return i
		}
	}
	return -1
}

// Group returns the group of axis that contains rank.
func (m *Mesh) Group(axis Axis, rank int) Group {
	l := m.Layout
	c := m.Coord(rank)
	tp, x := l.TPDegree(), l.ExpertTP()
	replica := c.Replica * l.DPShard * tp // first rank of the replica
	j := (c.Shard*tp + c.TP) % x          // etp index
	var g Group
	g.Axis = axis
	switch axis {
	case AxisReplicate:
		g.Index = c.Shard*tp + c.TP
		for p := 0; p < l.DPReplicate; p++ {
			g.Ranks = append(g.Ranks, (p*l.DPShard+c.Shard)*tp+c.TP)
		}
	case AxisShard:
		g.Index = c.Replica*tp + c.TP
		for s := 0; s < l.DPShard; s++ {
			g.Ranks = append(g.Ranks, replica+s*tp+c.TP)
		}
	case AxisTP:
		g.Index = c.Replica*l.DPShard + c.Shard
		for t := 0; t < tp; t++ {
			g.Ranks = append(g.Ranks, g.Index*tp+t)
		}
	case AxisEP:
		g.Index = (c.Replica*l.ExpertShard()+c.EFSDP)*x + j
		for e := 0; e < l.EP; e++ {
			g.Ranks = append(g.Ranks, replica+(c.EFSDP*l.EP+e)*x+j)
		}
	case AxisEFSDP:
		g.Index = (c.Replica*l.EP+c.EP)*x + j
		for f := 0; f < l.ExpertShard(); f++ {
			g.Ranks = append(g.Ranks, replica+(f*l.EP+c.EP)*x+j)
		}
	case AxisDP:
		for r := 0; r < m.World(); r++ {
			g.Ranks = append(g.Ranks, r)
		}
	default:
		panic("parallel: unknown mesh axis " + string(axis))
	}
	return g
}

// Groups returns every group of axis, by Index.
func (m *Mesh) Groups(axis Axis) []Group {
	seen := map[int]bool{}
	var gs []Group
	for r := 0; r < m.World(); r++ {
		g := m.Group(axis, r)
		if !seen[g.Index] {
			seen[g.Index] = true
			gs = append(gs, g)
		}
	}
	return gs
}

// ExpertShardDim is the dimension along which a routed expert's weights are
// FSDP-sharded over efsdp: 0 (the expert dimension of the stacked [E/ep, ·, ·]
// weights) unless efsdp·ep > experts, when dim 0 would pad and torchtitan
// shards dim 1 instead (torchtitan parallelize: Shard(1) when
// dp_mod_ep·ep > num_experts; with tp its efsdp counts the tp ranks EP
// borrows, ExpertShard).
func (m *Mesh) ExpertShardDim(experts int) int {
	if m.Layout.ExpertShard()*m.Layout.EP > experts {
		return 1
	}
	return 0
}

// String prints every factor of the mesh.
func (m *Mesh) String() string {
	l := m.Layout
	if tp := l.TPDegree(); tp > 1 {
		async := ""
		if l.AsyncTP {
			async = ", async"
		}
		return fmt.Sprintf("world %d = dp_replicate %d × dp_shard %d × tp %d%s; dp_shard × tp %d = efsdp %d × ep %d × etp %d; %d node(s) of %d GPUs; sharding %s",
			l.GPUs, l.DPReplicate, l.DPShard, tp, async, l.DPShard*tp, l.ExpertShard(), l.EP, l.ExpertTP(), m.Nodes(), m.GPUsPerNode, l.Sharding)
	}
	return fmt.Sprintf("world %d = dp_replicate %d × dp_shard %d; dp_shard %d = efsdp %d × ep %d; %d node(s) of %d GPUs; sharding %s",
		l.GPUs, l.DPReplicate, l.DPShard, l.DPShard, l.ExpertShard(), l.EP, m.Nodes(), m.GPUsPerNode, l.Sharding)
}
