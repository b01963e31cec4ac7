package main

import (
	"flag"
	"fmt"

	"github.com/moescope/moescope/moe"
)

// layoutFlags are the layout flags of DESIGN's contract, shared by memory,
// train, simulate and plan.
type layoutFlags struct {
	gpus, dpShard, dpReplicate, ep, gpusPerNode int
	sharding                                    string
	reshardAfterForward, keepGathered           bool
	allreduceLastOnly                           bool
}

func addLayoutFlags(fs *flag.FlagSet) *layoutFlags {
	f := &layoutFlags{}
	fs.IntVar(&f.gpus, "gpus", 0, "GPUs in the job (world size)")
	fs.IntVar(&f.dpShard, "dp-shard", 0, "FSDP/ZeRO shard degree (default gpus/dp-replicate)")
	fs.IntVar(&f.dpReplicate, "dp-replicate", 0, "data-parallel replicas (HSDP; default 1)")
	fs.IntVar(&f.ep, "ep", 1, "expert-parallel degree (divides dp-shard)")
	fs.StringVar(&f.sharding, "sharding", "fsdp", "what dp-shard shards: fsdp|zero2|zero1|ddp")
	fs.BoolVar(&f.reshardAfterForward, "reshard-after-forward", true, "free gathered weights after each block's forward")
	fs.BoolVar(&f.keepGathered, "keep-gathered", false, "keep unsharded weights from backward to the next forward")
	fs.BoolVar(&f.allreduceLastOnly, "allreduce-last-only", false, "replica all-reduce only on the last accumulation micro-step")
	fs.IntVar(&f.gpusPerNode, "gpus-per-node", 0, "GPUs per host (default from the cluster)")
	return f
}

// layout resolves the flags into a validated layout for the model.
func (f *layoutFlags) layout(cfg *moe.Config) (moe.Layout, error) {
	l := moe.Layout{
		GPUs: f.gpus, DPShard: f.dpShard, DPReplicate: f.dpReplicate, EP: f.ep,
		Sharding: moe.Sharding(f.sharding), ReshardAfterForward: f.reshardAfterForward,
		KeepGathered: f.keepGathered, AllreduceLastOnly: f.allreduceLastOnly, GPUsPerNode: f.gpusPerNode,
	}
	if err := l.Resolve(); err != nil {
		return l, fmt.Errorf("%w: layout: %v", errUsage, err)
	}
	if cfg != nil {
		if err := l.CheckModel(cfg); err != nil {
			return l, fmt.Errorf("%w: layout: %v", errUsage, err)
		}
	}
	return l, nil
}
