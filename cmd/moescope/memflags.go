package main

import (
	"flag"
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
)

// memoryModelFlags are the settings of the training run that change its
// memory, shared by every command that predicts it (DESIGN, "Precision and
// compile"): torch.compile, the allocator's segment mode, and the type the
// cross-entropy computes in.
type memoryModelFlags struct {
	compile, expandable *bool
	lossDType           *string
}

func addMemoryModelFlags(fs *flag.FlagSet) *memoryModelFlags {
	return &memoryModelFlags{
		compile: fs.Bool("compile", true, "torch.compile the blocks and the loss as torchtitan's --compile.enable does "+
			"(fused intermediates are not saved; --compile=false is eager)"),
		expandable: fs.Bool("expandable-segments", true, "the caching allocator grows segments in place "+
			"(PYTORCH_ALLOC_CONF=expandable_segments:True, as torchtitan's run_train.sh sets; false = fixed segments)"),
		lossDType: fs.String("loss-dtype", "f32", "type the eager cross-entropy computes in: f32 (torchtitan's pred.float()) or bf16 (no upcast)"),
	}
}

// apply sets o's compile, segment and loss-type choices from the flags.
func (f *memoryModelFlags) apply(o *memory.Options) error {
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
