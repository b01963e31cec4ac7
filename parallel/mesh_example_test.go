package parallel_test

import (
	"fmt"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
)

// Eight ranks as 2 replicas × 4 shards with expert parallelism 2, four GPUs
// per node: the groups rank 6 belongs to.
func ExampleNewMesh() {
	l := job.Layout{GPUs: 8, DPReplicate: 2, EP: 2, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		fmt.Println(err)
		return
	}
	m, err := parallel.NewMesh(l, nil, 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m)
	for _, a := range parallel.MeshAxes() {
		g := m.Group(a, 6)
		fmt.Println(g.Name(), g.Ranks)
	}
	// Output:
	// world 8 = dp_replicate 2 × dp_shard 4; dp_shard 4 = efsdp 2 × ep 2; 2 node(s) of 4 GPUs; sharding fsdp
	// dp_replicate[2] [2 6]
	// dp_shard[1] [4 5 6 7]
	// ep[3] [6 7]
	// efsdp[2] [4 6]
	// dp[0] [0 1 2 3 4 5 6 7]
	// tp[6] [6]
}
