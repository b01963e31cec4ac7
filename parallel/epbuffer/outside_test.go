package epbuffer

import (
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// TestOutsideByDispatcher: by hand from the h100 registry entry (3 GiB
// outside PyTorch, 3.28e9 bytes more for an all-to-all communicator) and
// TestDeepEPBytes' DeepSeek-V3 Buffer (369,264,256 bytes at ep 8, hidden
// 7168): all_to_all at ep 8 holds 3,221,225,472 + 3,280,000,000 =
// 6,501,225,472; DeepEP at ep 8 holds 3,221,225,472 + 369,264,256 =
// 3,590,489,728, its group's communicator opening no point-to-point
// connections; without expert parallelism both hold the 3 GiB.
func TestOutsideByDispatcher(t *testing.T) {
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    job.Dispatcher
		ep   int
		want int64
	}{{job.AllToAll, 8, 6501225472}, {job.DeepEP, 8, 3590489728}, {job.AllToAll, 1, 3221225472}, {job.DeepEP, 1, 3221225472}} {
		got, err := Outside(dev, job.Layout{EP: c.ep}, c.d, 7168)
		if err != nil || got != c.want {
			t.Errorf("Outside(h100, ep %d, %s) = %d, %v; want %d", c.ep, c.d, got, err, c.want)
		}
	}
}
