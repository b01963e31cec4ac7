// Package sim walks the per-rank program of a training step (package
// parallel's Schedule) in virtual time on a modelled cluster: compute ops
// priced from their exact FLOP and byte counts (tile- and wave-quantized
// GEMMs, grouped expert GEMMs, flash attention, memory-bound ops, launch
// overheads), collectives from NCCL's cost model on the cluster's link
// classes, streams that overlap as scheduled, and memory as package
// memory's allocation timeline replayed through its caching-allocator
// model. It also holds the calibration parameters the models read
// (Calibration, with the TPS interval a fitted one gives; package calib
// fits them), the published-runs schema and the validation of memory
// predictions against them, and Chrome traces of a simulated step.
//
// It imports parallel, parallel/hw, memory, flops, moe and internal/fileio;
// parallel/sim/calib, parallel/plan and cmd/moescope import it. It never
// imports parallel/numeric, nor numeric it.
package sim
