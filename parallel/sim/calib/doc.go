// Package calib fits the simulator's parameters (cost.Calibration) to
// measured runs in the published-runs schema (published.Run): Calibrate
// simulates every run under trial calibrations (sim.Prepare, then
// Prepared.Run) and fits ln TPS by Levenberg–Marquardt with the grounded
// defaults as prior (calfit.go), then the allocator overhead to the runs
// that report peak reserved memory. IdentifiedParams is its rule for which
// parameters a set of runs can tell apart, which a sweep plans with.
// Package parallel/sim/validate calibrates each series of published runs
// with it for the TPS validation table.
//
// It imports parallel/sim/published, parallel/sim, parallel/sim/cost,
// memory, flops and moe; parallel/sim/validate, parallel/plan and
// cmd/moescope import it.
package calib
