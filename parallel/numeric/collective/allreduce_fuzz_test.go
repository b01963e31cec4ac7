package collective

import (
	"context"
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
)

// FuzzAllReduceBroadcast: on n ranks, all-reduce leaves on every member
// the float32 sum of the members' buffers taken left to right in group
// order (computed here independently, serially), and a broadcast from any
// root leaves the root's buffer on every member, bit for bit.
func FuzzAllReduceBroadcast(f *testing.F) {
	f.Add(uint8(2), uint8(0), uint8(3), []byte{1, 2, 3, 4, 5, 6})
	f.Add(uint8(4), uint8(3), uint8(1), []byte{0x7f, 0x80, 0xff, 1})
	f.Add(uint8(1), uint8(0), uint8(8), []byte{})
	f.Fuzz(func(t *testing.T, n8, root8, len8 uint8, data []byte) {
		n, size := int(n8%8)+1, int(len8%16)
		root := int(root8) % n
		val := func(r, k int) float32 {
			if len(data) == 0 {
				return 0
			}
			b := data[(r*size+k)%len(data)]
			// Mixed magnitudes and signs, so that the order of the sum matters.
			return float32(int8(b)) * float32(math.Pow(2, float64(int(b)%11-5)))
		}
		want := make([]float32, size)
		for k := range want {
			for r := 0; r < n; r++ {
				want[k] += val(r, k)
			}
		}
		c := testComm(t, n, 1, 8)
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			r := ep.Rank()
			g := c.Mesh().Group(parallel.AxisShard, r)
			x, y := make([]float32, size), make([]float32, size)
			for k := range x {
				x[k], y[k] = val(r, k), val(r, k)
			}
			if err := ep.AllReduce(ctx, g, moe.F32, x); err != nil {
				return err
			}
			if err := ep.Broadcast(ctx, g, moe.F32, root, y); err != nil {
				return err
			}
			for k := range x {
				if math.Float32bits(x[k]) != math.Float32bits(want[k]) {
					t.Errorf("rank %d element %d: all-reduce %v, serial sum %v", r, k, x[k], want[k])
				}
				if math.Float32bits(y[k]) != math.Float32bits(val(g.Ranks[root], k)) {
					t.Errorf("rank %d element %d: broadcast %v, root's %v", r, k, y[k], val(g.Ranks[root], k))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
