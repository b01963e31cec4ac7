// Package published holds the published-runs schema of DESIGN.md (Run),
// shared by testdata/published/ and `moescope calibrate --runs`: its
// reader (ReadRuns; Load for a folder of files, refusing runs recorded
// twice), each run's validation, layout and memory options, and
// InputForRun, which turns a run into the simulator's input. Its tests
// print the published-runs memory table (TestPublishedMemory).
//
// It imports parallel/sim, parallel/sim/cost, memory, moe, moe/hf and
// parallel/hw; parallel/sim/calib, parallel/titanlog and cmd/moescope
// import it (and parallel/plan's tests).
package published
