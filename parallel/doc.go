// Package parallel is the shared core of moescope's distributed training
// model, the part both backends agree on: the device mesh and its
// communication groups (dp_replicate × dp_shard × tp, tp innermost, with EP
// borrowed from dp_shard × tp as torchtitan v0.2.2's ParallelDims does), the
// tensor-parallel collectives of each layer (TPCollectives), the per-rank
// program of one training step (Schedule, built by
// BuildSchedule from a job.Layout: compute ops, collectives on their groups,
// stream assignment and dependencies, in the order package memory's
// allocation timeline assumes), FSDP shard geometry, and the batch plan
// (which sequences each rank and micro-step takes).
//
// Two backends execute a Schedule: parallel/numeric with goroutine ranks
// and real tensors, parallel/sim in virtual time. parallel/plan searches
// layouts with the simulator; parallel/hw holds the device and cluster
// registry.
//
// It imports parallel/hw, memory, flops and moe; it imports none of its
// sub-packages but hw, which all import it.
package parallel
