// Package numeric executes the per-rank program of a training step for real:
// one goroutine per rank, each holding its own FSDP shards, optimizer state
// and memory account, moving data only through the collectives of package
// collective's Comm (all-gather, reduce-scatter, all-reduce, all-to-all,
// broadcast, barrier, with deadlock detection, per-call timeouts and a
// watchdog), with expert parallelism's dispatch and combine, tensor
// parallelism with sequence parallelism (tp.go), context parallelism
// (cp.go: ring or all-gather attention on the cp ranks of the folded
// mesh), pipeline parallelism (pipeline.go), training checkpoints, and a
// guard on host memory.
// N ranks produce what one rank produces: that proves the schedule of
// package parallel correct.
//
// It imports parallel/numeric/collective, parallel, memory, moe/job and moe
// (with moe/attn, moe/hf, moe/kernel and moe/safetensors), and internal/fileio; only
// cmd/moescope and parallel/plan-level code import it. It never imports parallel/sim, nor
// sim it: the two backends of one schedule stay apart.
package numeric
