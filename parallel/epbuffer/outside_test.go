package epbuffer

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// TestOutsideByDispatcher: by hand from the h100 registry entry (3 GiB
// outside PyTorch, 3.28e9 bytes more for an all-to-all communicator) and
// TestDeepEPBytes' DeepSeek-V3 Buffer (369,264,256 bytes at ep 8, hidden
// 7168): all_to_all at ep 8 holds 3,221,225,472 + 3,280,000,000 =
// 6,501,225,472; DeepEP at ep 8 holds 3,221,225,472 + 369,264,256 =
// 3,590,489,728, its group's communicator opening no point-to-point
// connections; HybridEP at ep 8 with 128 experts (16 local) and lbs 2 ×
// 4096 tokens holds 3,221,225,472 + its NVLink buffers (HybridEPBytes'
// rule: maxT = 8192 · 8 = 65,536 rows of 7168 bf16 = 939,524,096, their
// probabilities 65,536 · 16 · 8 · 4 = 33,554,432 and scales 65,536 · 56 · 4
// = 14,680,064: 987,758,592) = 4,208,984,064; without expert parallelism
// all hold the 3 GiB.
func TestOutsideByDispatcher(t *testing.T) {
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    job.Dispatcher
		ep   int
		want int64
	}{{job.AllToAll, 8, 6501225472}, {job.DeepEP, 8, 3590489728}, {job.AllToAll, 1, 3221225472}, {job.DeepEP, 1, 3221225472}, {job.HybridEP, 8, 4208984064}} {
		s := job.Spec{Model: &moe.Config{Hidden: 7168, Experts: 128}, Layout: job.Layout{EP: c.ep}}
		s.LBS, s.Seq = 2, 4096
		s.Dispatcher = c.d
		got, err := Outside(dev, s, 8)
		if err != nil || got != c.want {
			t.Errorf("Outside(h100, ep %d, %s) = %d, %v; want %d", c.ep, c.d, got, err, c.want)
		}
	}
}

// TestOutsideHybridEPPipelineMicroBatch: HybridEP sizes its buffers for
// one dispatch, a pipeline's micro-batch (pp_microbatch_size sequences),
// not the rank's local batch of every micro-batch in flight: a pp 2 rank
// with 256 local sequences of 4096 in micro-batches of 1 holds what a
// one-sequence rank without a pipeline holds (4,208,984,064 − 3 GiB at
// 2 × 4096 tokens in TestOutsideByDispatcher; here 4096 tokens: maxT
// 32,768, 469,762,048 + 16,777,216 + 7,340,032 = 493,879,296 bytes).
func TestOutsideHybridEPPipelineMicroBatch(t *testing.T) {
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	s := job.Spec{Model: &moe.Config{Hidden: 7168, Experts: 128}, Layout: job.Layout{EP: 8, PP: 2, PPMicrobatchSize: 1}}
	s.Dispatcher, s.LBS, s.Seq = job.HybridEP, 256, 4096
	got, err := Outside(dev, s, 8)
	if want := int64(3221225472 + 493879296); err != nil || got != want {
		t.Errorf("Outside(pp 2, lbs 256, micro-batch 1) = %d, %v; want %d", got, err, want)
	}
}
