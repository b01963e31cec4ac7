package hw_test

import (
	"fmt"

	"github.com/moescope/moescope/parallel/hw"
)

func ExampleLookupDevice() {
	d, _ := hw.LookupDevice("b200")
	fmt.Printf("%s: %.4g BF16 FLOP/s dense, %.2f GiB as PyTorch reports it, %d SMs\n", d.Name, d.BF16FLOPs, d.MemoryGiB(), d.SMs)
	// Output: b200: 2.25e+15 BF16 FLOP/s dense, 178.35 GiB as PyTorch reports it, 148 SMs
}
