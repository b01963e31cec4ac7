// Package published holds the published-runs schema of DESIGN.md (Run),
// shared by parallel/sim/validate/testdata/published/ and `moescope
// calibrate --runs`: a run is job.Spec's JSON (layout, batch,
// checkpointing, recipe) plus the model's name, the hardware and the
// measured fields. Its one reader (ReadRuns; ReadFile for one file on
// disk, Load for a folder of files and LoadFS for a folder of a file
// system such as the runs embedded in the binary, both refusing runs
// recorded twice) decodes each run over the schema's defaults (Defaults)
// and resolves it; a model named by a path is relative to its file's
// folder and read where the file was (LoadModel). SpecFor and InputForRun
// turn a run into the description and the simulator's input a prediction
// takes. Package parallel/sim/validate embeds the published runs and
// prints their validation tables.
//
// It imports parallel/sim, moe, moe/job, moe/hf, parallel/hw and
// internal/fileio; parallel/sim/calib, parallel/sim/validate,
// parallel/titanlog and cmd/moescope import it (and parallel/plan's
// tests).
package published
