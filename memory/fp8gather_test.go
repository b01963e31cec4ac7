package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestFP8Gather: denseCfg's linear weights per block are q 1024 + k 512 +
// v 512 + o 1024 + MLP 6144 = 9216 elements and its head 64·32 = 2048 (by
// hand, denseCfg's comment); an fp8 all-gather of the linear set gathers
// each block's 9216 in one byte, so its gathered weights are
// 2·9280 − 9216 = 9344 bytes instead of 18560, the head's unchanged unless
// the output set is converted too; DDP gathers nothing, so nothing changes.
func TestFP8Gather(t *testing.T) {
	cfg := denseCfg()
	units, err := Units(cfg, layout(8, 8, 1, job.ShardFSDP))
	if err != nil {
		t.Fatal(err)
	}
	if u := units[1]; u.Linear != 9216 || u.Output != 0 {
		t.Errorf("block 0: linear %d, output %d; want 9216, 0", u.Linear, u.Output)
	}
	if u := units[len(units)-1]; u.Linear != 0 || u.Output != 2048 {
		t.Errorf("head: linear %d, output %d; want 0, 2048", u.Linear, u.Output)
	}
	weights := func(l job.Layout, r job.Recipe) (block, head int64) {
		t.Helper()
		if err := r.Resolve(); err != nil {
			t.Fatal(err)
		}
		rep, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 16, GradAccum: 1}, OptionsOf(r, moe.AC{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range rep.Events {
			if e.Alloc && e.Label == "weights" && e.Layer == 0 && block == 0 {
				block = e.Bytes
			}
			if e.Alloc && e.Label == "weights" && e.Layer == cfg.LayerHead() && head == 0 {
				head = e.Bytes
			}
		}
		return block, head
	}
	r := job.DefaultRecipe()
	r.Precision, r.FP8AllGather = job.FP8Tensorwise, true
	fsdp := layout(8, 8, 1, job.ShardFSDP)
	if b, h := weights(fsdp, r); b != 9344 || h != 2*(2048+32) {
		t.Errorf("fp8 all-gather of linear: block %d B, head %d B; want 9344, %d", b, h, 2*(2048+32))
	}
	r.Quantize = job.Quantize{job.QuantLinear, job.QuantOutput}
	if _, h := weights(fsdp, r); h != 2048+2*32 {
		t.Errorf("fp8 all-gather of output: head %d B, want %d", h, 2048+2*32)
	}
	if b, _ := weights(fsdp, job.DefaultRecipe()); b != 2*9280 {
		t.Errorf("bf16: block %d B, want %d", b, 2*9280)
	}
}
