// Package cost holds the simulator's time models and the calibration
// that scales them: the GPU time of one op record of the vocabulary
// (ComputeSpec: tile- and wave-quantized GEMMs, grouped expert GEMMs,
// flash attention, memory-bound ops with their eager and compiled bytes,
// launch floors, the sustained clock and the slowest GPU), the time of one
// collective from NCCL's cost model on the cluster's link classes
// (Collective) and of one pipeline message (P2PSeconds), the prices of
// the overheads a step pays beyond its ops, and Calibration, the fitted
// multipliers and efficiencies every model reads (package calib fits
// them). It knows nothing of schedules walked in time: package sim prices
// a schedule's ops with it.
//
// It imports parallel (collective kinds and schedule ops), parallel/hw,
// moe and internal/fileio; parallel/sim and the packages above it import
// it.
package cost
