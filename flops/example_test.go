package flops_test

import (
	"fmt"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// The built-in tiny model, worked by hand in flops_test.go.
func ExampleCountParams() {
	cfg, _ := hf.Load("tiny")
	p, _ := flops.CountParams(cfg)
	fmt.Println(p.Total, p.Active, p.ByGroup[moe.GroupRouted], p.ActiveByGroup[moe.GroupRouted])
	// Output: 21312 18240 6144 3072
}

func ExampleCount() {
	cfg, _ := hf.Load("tiny")
	t, _ := flops.Count(cfg, flops.Shape{Seq: 8, Batch: 2}, moe.AC{Mode: moe.ACSelective}, flops.DefaultTile)
	for _, c := range []flops.Convention{flops.Torchtitan, flops.Megatron, flops.Model} {
		fmt.Printf("%s %.0f FLOPs/token\n", c, t.PerToken[c])
	}
	// MFU of 1000 tokens/s on a 989 TFLOP/s device, torchtitan convention.
	fmt.Printf("%.3g\n", flops.MFU(t.PerToken[flops.Torchtitan], 1000, 989e12))
	// Output:
	// torchtitan 103296 FLOPs/token
	// megatron 110592 FLOPs/token
	// model 99456 FLOPs/token
	// 1.04e-07
}

// Ops lists one record per (layer, op, pass); here the first block's
// query projection: T·q·D = 16·32·32 multiply-adds in each pass, saved
// (not recomputed) by selective checkpointing.
func ExampleOps() {
	cfg, _ := hf.Load("tiny")
	recs, _ := flops.Ops(cfg, flops.Shape{Seq: 8, Batch: 2}, moe.AC{Mode: moe.ACSelective}, flops.ExactTile)
	for _, r := range recs {
		if r.Layer == 0 && r.Op == moe.OpQProj {
			fmt.Println(r.Pass, r.Count)
		}
	}
	// Output:
	// forward 16384
	// backward_data 16384
	// backward_weight 16384
}
