package collective_test

import (
	"context"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// Four goroutine ranks all-reduce their rank numbers; the bytes each sent
// follow the ring algorithm: 2·(n−1)/n·S = 2·3/4·(1 × 4 B) = 6 B.
func ExampleComm_Run() {
	l := job.Layout{GPUs: 4, Sharding: job.ShardFSDP}
	_ = l.Resolve()
	m, _ := parallel.NewMesh(l, nil, 8)
	c := collective.New(m)
	sums := make([]float32, 4)
	err := c.Run(context.Background(), func(ctx context.Context, ep *collective.Endpoint) error {
		buf := []float32{float32(ep.Rank())}
		if err := ep.AllReduce(ctx, m.Group(parallel.AxisShard, ep.Rank()), moe.F32, buf); err != nil {
			return err
		}
		sums[ep.Rank()] = buf[0]
		return nil
	})
	fmt.Println(sums, err, c.Stats.Rank(0)[parallel.CollAllReduce].Sent())
	// Output: [6 6 6 6] <nil> 6
}
