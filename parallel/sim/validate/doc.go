// Package validate checks moescope's predictions against measured
// training runs: the TPS table (TPS: every run's measured tokens per
// second per GPU beside the uncalibrated prediction and, per series, the
// prediction calibrated on the series' smallest-GPU-count runs), the
// memory table (Memory: the predicted peak beside the measured one, and
// whether moescope says the layout fits), and the rows of the shared
// validation table moescope cannot express, each with the feature it
// needs (Shared). Validate joins them into a Report (Embedded for the
// embedded published runs, File for a runs file of one's own, Runs for
// either, as `moescope validate --runs` chooses); WriteText prints it as
// the command does.
//
// The published runs (testdata/published, with the config.json files
// their models name by path) and the shared table's copy
// (testdata/validation/published_runs.csv) are embedded in the binary
// (Published, EmbeddedTable): one copy, which the tests here guard
// (TestPublishedTPS, TestPublishedMemory) and the command prints.
//
// It imports parallel/sim/calib, parallel/sim/published, parallel/sim,
// parallel/sim/cost, parallel/hw, memory, moe and moe/hf; cmd/moescope
// imports it.
package validate
