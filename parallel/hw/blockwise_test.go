package hw

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
)

// TestBlockwiseDevices: TransformerEngine enables FP8 block scaling at
// compute capability 9.0 and above (quantization.py at d0067d0d), so
// fp8-blockwise runs on the registry's Hopper and Blackwell parts and is
// refused on the AMD ones, naming the device.
func TestBlockwiseDevices(t *testing.T) {
	for name, ok := range map[string]bool{"h100": true, "h200": true, "b200": true, "gb300": true, "mi300x": false, "mi355x": false} {
		d, err := LookupDevice(name)
		if err != nil {
			t.Fatal(err)
		}
		err = d.Runs(job.FP8Blockwise)
		if ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), name)) {
			t.Errorf("%s: %v, want runs = %v (a refusal naming the device)", name, err, ok)
		}
	}
}
