package main

import (
	"flag"
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
)

// memoryModelFlags are the settings of the training run that change its
// memory, shared by every command that predicts it (DESIGN, "Precision and
// compile"): torch.compile, the allocator's segment mode, the type the
// cross-entropy computes in, and the types gradients and AdamW moments are
// stored and gradients reduced in (which the step time's collectives move
// too).
type memoryModelFlags struct {
	compile, expandable             *bool
	lossDType, gradT, optT, reduceT *string
}

func addMemoryModelFlags(fs *flag.FlagSet) *memoryModelFlags {
	return &memoryModelFlags{
		compile: fs.Bool("compile", true, "torch.compile the blocks and the loss as torchtitan's --compile.enable does "+
			"(fused intermediates are not saved; --compile=false is eager)"),
		expandable: fs.Bool("expandable-segments", true, "the caching allocator grows segments in place "+
			"(PYTORCH_ALLOC_CONF=expandable_segments:True, as torchtitan's run_train.sh sets; false = fixed segments)"),
		lossDType: fs.String("loss-dtype", "f32", "type the eager cross-entropy computes in: f32 (torchtitan's pred.float()) or bf16 (no upcast)"),
		gradT:     fs.String("grad-dtype", "f32", "gradient storage type: f32|bf16"),
		optT:      fs.String("optimizer-dtype", "f32", "AdamW moment storage type: f32|bf16"),
		reduceT: fs.String("reduce-dtype", "", "type gradients are reduced in (FSDP2 reduce_dtype) and, with --grad-sync-last-only, "+
			"accumulated in: f32|bf16 (default: the --grad-dtype)"),
	}
}

// apply sets o's compile, segment, loss-type and storage-type choices from
// the flags, on torchtitan's default mixed precision when o has none.
func (f *memoryModelFlags) apply(o *memory.Options) error {
	if o.Precision == (moe.Precision{}) {
		o.Precision = moe.DefaultPrecision
	}
	for _, t := range []struct {
		name, v string
		dst     *moe.DType
	}{{"grad-dtype", *f.gradT, &o.Precision.Grad}, {"optimizer-dtype", *f.optT, &o.Precision.Optimizer}, {"reduce-dtype", *f.reduceT, &o.ReduceDType}} {
		switch moe.DType(t.v) {
		case moe.F32, moe.BF16:
			*t.dst = moe.DType(t.v)
		case "":
			if t.name != "reduce-dtype" {
				return fmt.Errorf("%w: --%s = \"\": must be f32 or bf16", errUsage, t.name)
			}
		default:
			return fmt.Errorf("%w: --%s = %q: must be f32 or bf16", errUsage, t.name, t.v)
		}
	}
	switch moe.DType(*f.lossDType) {
	case moe.F32, moe.BF16:
		o.LossDType = moe.DType(*f.lossDType)
	default:
		return fmt.Errorf("%w: --loss-dtype = %q: must be f32 or bf16", errUsage, *f.lossDType)
	}
	o.Compile = memory.Compile{}
	if *f.compile {
		o.Compile = memory.Compiled
	}
	o.Segments = memory.Fixed
	if *f.expandable {
		o.Segments = memory.Expandable
	}
	return nil
}
