// Package job is the one description of a training run, Spec: the model
// (moe.Config), the layout its ranks form (Layout: every parallel degree,
// the sharding mode, FSDP and pipeline options, as torchtitan's
// ParallelDims builds its mesh), the batch (Batch, with the one set of
// limits every package checks), the checkpointing policy (moe.AC) and the
// recipe it executes with (Recipe: precision recipe, storage types,
// torch.compile, allocator, kernels, dispatcher, PyTorch release, routing
// skew), each field a typed value with a named default, defined, defaulted
// and validated here once. It also holds the order in which each pipeline
// rank runs its stages' micro-batches (PipelineOrder).
//
// Every package that counts, sizes, times or executes a run takes a Spec
// (memory.EstimateRun, parallel.BuildSchedule and BuildPipeline,
// sim.Input, the numeric trainers, the planner's evaluator), plus what is
// truly its own (a device, a mesh, a calibration, an allocator model). The
// command line derives one flag per Recipe field from the struct's tags,
// and a published run's fields decode into a Spec (parallel/sim/published).
//
// It sits between the model (package moe, which knows no ranks) and those
// packages: it imports moe only, and knows no devices and no time.
package job
