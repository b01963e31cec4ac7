package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// layoutFlags are the layout flags of DESIGN's contract, shared by memory,
// train, simulate and plan.
type layoutFlags struct {
	fs                                          *flag.FlagSet // to tell a flag given as 0 from one left out
	gpus, dpShard, dpReplicate, ep, gpusPerNode int
	tp, etp, cp                                 int
	cpMethod, cpLoadBalancer                    string
	sharding, fsdpImpl, ppImpl                  string
	reshardAfterForward, keepGathered           bool
	allreduceLastOnly, asyncTP                  bool
	pp, ppMicrobatchSize, ppVirtualStages       int
	ppSchedule, ppLayers                        string
	gradSyncLastOnly                            bool
	refused                                     [][2]string // flag name, why (refuse)
	// mtp refuses --mtp (mtp.go).
	mtp func() error
}

func addLayoutFlags(fs *flag.FlagSet) *layoutFlags {
	f := &layoutFlags{fs: fs}
	fs.IntVar(&f.gpus, "gpus", 0, "GPUs in the job (world size)")
	fs.IntVar(&f.dpShard, "dp-shard", 0, "FSDP/ZeRO shard degree (default gpus/dp-replicate)")
	fs.IntVar(&f.dpReplicate, "dp-replicate", 0, "data-parallel replicas (HSDP; default 1)")
	fs.IntVar(&f.ep, "ep", 1, "expert-parallel degree (ep × etp divides dp-shard × tp)")
	fs.IntVar(&f.tp, "tp", 1, "tensor-parallel degree, with sequence parallelism (innermost mesh axis)")
	fs.IntVar(&f.etp, "etp", 1, "tensor-parallel degree of routed experts when ep > 1: 1 (EP borrows the tp ranks) or the tp degree")
	fs.IntVar(&f.cp, "cp", 1, "context-parallel degree: each sequence split over cp ranks (mesh axis between dp-shard and tp)")
	fs.StringVar(&f.cpMethod, "cp-method", "", fmt.Sprintf("context parallelism's K/V exchange: %s (default allgather, torchtitan's; p2p is Megatron-Core's ring)", strings.Join(job.CPMethod("").Values(), "|")))
	fs.StringVar(&f.cpLoadBalancer, "cp-load-balancer", "", fmt.Sprintf("how a sequence's tokens are dealt to the cp ranks: %s (default headtail, torchtitan's)", strings.Join(job.CPLoadBalancer("").Values(), "|")))
	fs.BoolVar(&f.asyncTP, "async-tp", false, "async tensor parallelism: overlap TP collectives with the matmuls they feed (needs --compile)")
	fs.StringVar(&f.sharding, "sharding", "fsdp", "what dp-shard shards: fsdp|zero2|zero1|ddp")
	fs.StringVar(&f.fsdpImpl, "fsdp-impl", "fsdp2", "whose FSDP schedule fsdp sharding follows: fsdp2 (PyTorch's, as torchtitan applies it) or megatron (Megatron-Core's --use-custom-fsdp, a layer per unit)")
	fs.BoolVar(&f.reshardAfterForward, "reshard-after-forward", true, "free gathered weights after each block's forward (default off with --pp > 1, as torchtitan)")
	fs.BoolVar(&f.keepGathered, "keep-gathered", false, "keep unsharded weights from backward to the next forward")
	fs.BoolVar(&f.allreduceLastOnly, "allreduce-last-only", false, "replica all-reduce only on the last accumulation micro-step")
	fs.BoolVar(&f.gradSyncLastOnly, "grad-sync-last-only", false, "reduce gradients only on the last accumulation micro-step, "+
		"keeping each unit's unsharded gradients before (FSDP2 set_requires_gradient_sync(False); under zero1 or ddp DDP's no_sync, Megatron-Core's no_sync_func; not zero2)")
	fs.IntVar(&f.gpusPerNode, "gpus-per-node", 0, fmt.Sprintf("GPUs per host, in [1, %d] (default from the cluster)", hw.MaxGPUsPerNode))
	fs.IntVar(&f.pp, "pp", 0, "pipeline-parallel stages (outermost mesh axis; default 1)")
	fs.StringVar(&f.ppSchedule, "pp-schedule", "", fmt.Sprintf("pipeline schedule, torchtitan's names: %v (default 1F1B)", job.PPSchedules()))
	fs.IntVar(&f.ppMicrobatchSize, "pp-microbatch-size", 0, "sequences per pipeline micro-batch; micro-batches per micro-step = lbs ÷ it (default 1)")
	fs.IntVar(&f.ppVirtualStages, "pp-virtual-stages", 0, "pipeline stages per rank (default 1; 2 for multi-stage schedules, as torchtitan)")
	fs.StringVar(&f.ppLayers, "pp-layers", "", "explicit split of the transformer layers over the pp × virtual stages, e.g. 10,12,12,10 (default torchtitan's even split)")
	fs.StringVar(&f.ppImpl, "pp-impl", "torch", "whose pipeline buffers a stage holds: torch (PyTorch's pipelining, a receive buffer per micro-batch for the step) or megatron (Megatron-Core's p2p: receives held until their backward, outputs freed once sent)")
	f.mtp = addMTPFlag(fs)
	return f
}

// layout resolves the flags into a validated layout for the model. A
// degree left out is derived from the others; one given must be ≥ 1 (an
// explicit --gpus 0 once derived the world from --dp-shard and ran).
func (f *layoutFlags) layout(cfg *moe.Config) (job.Layout, error) {
	if err := f.mtp(); err != nil {
		return job.Layout{}, err
	}
	set := setFlags(f.fs)
	for _, d := range []struct {
		name string
		v    int
	}{{"gpus", f.gpus}, {"dp-shard", f.dpShard}, {"dp-replicate", f.dpReplicate}, {"ep", f.ep}, {"tp", f.tp}, {"etp", f.etp}, {"cp", f.cp}, {"pp", f.pp},
		{"pp-microbatch-size", f.ppMicrobatchSize}, {"pp-virtual-stages", f.ppVirtualStages}} {
		if set[d.name] && d.v < 1 {
			return job.Layout{}, fmt.Errorf("%w: --%s = %d: must be in [1, %d] (leave it out for its default)", errUsage, d.name, d.v, job.MaxDegree)
		}
	}
	if set["gpus-per-node"] && (f.gpusPerNode < 1 || f.gpusPerNode > hw.MaxGPUsPerNode) {
		return job.Layout{}, fmt.Errorf("%w: --gpus-per-node = %d: must be in [1, %d] (leave it out for the cluster's)", errUsage, f.gpusPerNode, hw.MaxGPUsPerNode)
	}
	l := job.Layout{
		GPUs: f.gpus, DPShard: f.dpShard, DPReplicate: f.dpReplicate, EP: f.ep, TP: f.tp, ETP: f.etp,
		Sharding: job.Sharding(f.sharding), FSDPImpl: job.FSDPImpl(f.fsdpImpl), ReshardAfterForward: f.reshardAfterForward,
		KeepGathered: f.keepGathered, AllreduceLastOnly: f.allreduceLastOnly, AsyncTP: f.asyncTP, GPUsPerNode: f.gpusPerNode,
		PP: f.pp, PPSchedule: job.PPSchedule(f.ppSchedule), PPMicrobatchSize: f.ppMicrobatchSize,
		PPVirtualStages: f.ppVirtualStages, PPLayers: job.StageLayers(f.ppLayers), PPImpl: job.PPImpl(f.ppImpl),
		GradSyncLastOnly: f.gradSyncLastOnly, CP: f.cp, CPMethod: job.CPMethod(f.cpMethod), CPLoadBalancer: job.CPLoadBalancer(f.cpLoadBalancer),
	}
	if l.PP > 1 && !set["reshard-after-forward"] {
		// torchtitan's default under PP: apply_fsdp's "default" policy is
		// reshard_after_forward = not pp_enabled (torchtitan 02ef790c,
		// models/llama3/infra/parallelize.py).
		l.ReshardAfterForward = false
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

// refuseMegatron is the error of a command that cannot follow Megatron's
// FSDP when the layout asks for it (nil otherwise): only fsdp2 is refused
// by no command.
func refuseMegatron(l job.Layout, cmd, why string) error {
	if l.FSDPImpl != job.FSDPMegatron {
		return nil
	}
	return fmt.Errorf("%w: --fsdp-impl = megatron: not modelled by %s: %s (simulate prices its schedule)", errUsage, cmd, why)
}

// refuse makes a layout flag the command does not use an error when given,
// saying why in its help and in the error (a flag accepted and ignored
// once let memory --gpus-per-node 9223372036854775807 pass).
func (f *layoutFlags) refuse(name, why string) {
	f.fs.Lookup(name).Usage = "not used here (refused): " + why
	f.refused = append(f.refused, [2]string{name, why})
}

// checkRefused returns the error of the first refused flag the command line
// gives.
func (f *layoutFlags) checkRefused() error {
	set := setFlags(f.fs)
	for _, r := range f.refused {
		if set[r[0]] {
			return fmt.Errorf("%w: --%s = %s: not used by %s: %s", errUsage, r[0], f.fs.Lookup(r[0]).Value, strings.TrimPrefix(f.fs.Name(), "moescope "), r[1])
		}
	}
	return nil
}
