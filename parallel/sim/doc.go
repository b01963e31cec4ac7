// Package sim walks the per-rank program of a training step (package
// parallel's Schedule) in virtual time on a modelled cluster: compute ops
// priced from their exact FLOP and byte counts (tile- and wave-quantized
// GEMMs, grouped expert GEMMs, flash attention, memory-bound ops, launch
// overheads), collectives from NCCL's cost model on the cluster's link
// classes, streams that overlap as scheduled, and memory as package
// memory's allocation timeline replayed through its caching-allocator
// model. It also holds the calibration parameters the models read
// (Calibration, with the TPS interval a fitted one gives) and Chrome traces
// of a simulated step. Two packages above it hold the rest of what
// concerns measured runs: parallel/sim/published the published-runs schema
// (and InputForRun, a run as an Input), parallel/sim/calib the fitting of
// a Calibration to such runs.
//
// It imports parallel, parallel/hw, memory, flops, moe and internal/fileio;
// parallel/sim/published, parallel/sim/calib, parallel/plan,
// parallel/titanlog and cmd/moescope import it. It never imports
// parallel/numeric, nor numeric it.
package sim
