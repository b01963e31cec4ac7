// Package titanlog reads back what torchtitan prints and is configured with,
// so that runs a user made with moescope's exports become measured runs in
// the published-runs schema (published.Run) without copying numbers by hand.
//
// Four inputs, each read to the format in torchtitan's own source at the
// two commits moescope exports for (plan.TorchtitanTOMLCommit, v0.2.2, and
// plan.TorchtitanPyCommit, main):
//
//   - the console log: MetricsProcessor.log in torchtitan/components/metrics.py
//     prints one line per logged step, `step: N  loss: …  grad_norm: …
//     memory: X.XXGiB(Y.YY%)  tps: N,NNN  tflops: …  mfu: …%` (main prints
//     `mfu: N/A` when the device's peak is unknown), coloured with the ANSI
//     codes of torchtitan/tools/utils.py Color, behind the logger header
//     `[titan] <asctime> - <name> - <level> - ` of torchtitan/tools/logging.py,
//     and behind torchrun's `[rankN]:` prefix (run_train.sh passes
//     `--role rank --tee 3`);
//   - the start-up lines (Facts, facts.go): Trainer's `Trainer is initialized
//     with …` (local and global batch and sequence length in v0.2.2's
//     train.py, tokens per DP rank and per step and the context length in
//     main's trainer.py), ParallelDims.build_mesh's `Building device mesh
//     with parallelism: …` and `Model NAME FLAVOR size: …`, checked against
//     the job config (ErrMismatch);
//   - the job config: the TOML file of v0.2.2 (torchtitan/config/job_config.py),
//     the config-registry function moescope exports for main, or the JSON
//     torchtitan prints at start-up under `Running with configs:` when
//     job.print_config (v0.2.2) or debug.print_config (main) is set;
//   - the device: `CUDA capacity: <name> with X.XXGiB memory`
//     (build_device_memory_monitor, metrics.py), checked against the GPU the
//     user names.
//
// Input turns one parsed log into a run; Files reads the logs and job
// configs calibrate names, each bounded, into runs.
package titanlog
