// Package published holds the published-runs schema of DESIGN.md (Run),
// shared by parallel/sim/validate/testdata/published/ and `moescope calibrate --runs`: a run is
// job.Spec's JSON (layout, batch, checkpointing, recipe) plus the model's
// name, the hardware and the measured fields. Its one reader (ReadRuns;
// Load for a folder of files, refusing runs recorded twice) decodes each
// run over the schema's defaults (Defaults) and resolves it; SpecFor and
// InputForRun turn a run into the description and the simulator's input
// a prediction takes. Its tests print the published-runs memory table
// (TestPublishedMemory).
//
// It imports parallel/sim, moe, moe/job, moe/hf and parallel/hw; parallel/sim/calib, parallel/titanlog and cmd/moescope
// import it (and parallel/plan's tests).
package published
