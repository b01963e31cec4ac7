// Package sim walks the per-rank program of a training step (package
// parallel's Schedule) in virtual time on a modelled cluster: compute ops
// and collectives priced by package cost's models (from their exact FLOP
// and byte counts, and NCCL's cost model on the cluster's link classes),
// streams that overlap as scheduled (the engine, sim_engine.go), pipeline
// ranks walked program by program (pipeline.go), and memory as package
// memory's allocation timeline replayed through its caching-allocator
// model. It also holds the TPS interval a fitted calibration gives, the
// names of the overheads it charges and Chrome traces of a simulated step.
//
// Three packages beside it hold the rest: parallel/sim/cost, below it, the
// time models and the Calibration they read; parallel/sim/published, above
// it, the published-runs schema and InputForRun, a measured run as an
// Input; parallel/sim/calib, above that, the fitting of a Calibration to
// measured runs (Prepare and Prepared.Run are for it).
//
// It imports parallel/sim/cost, parallel, parallel/hw, memory, flops, moe
// and moe/job; parallel/sim/published, parallel/sim/calib, parallel/plan,
// parallel/titanlog and cmd/moescope import it. It never imports
// parallel/numeric, nor numeric it.
package sim
