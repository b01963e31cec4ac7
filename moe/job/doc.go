// Package job describes one training run: the layout its ranks form
// (Layout: every parallel degree, the sharding mode, FSDP and pipeline
// options, as torchtitan's ParallelDims builds its mesh) and the order in
// which each pipeline rank runs its stages' micro-batches (PipelineOrder).
//
// It sits between the model (package moe, which knows no ranks) and the
// packages that count, time or execute a run (flops, memory, parallel and
// below): it imports moe only, and knows no devices and no time.
package job
