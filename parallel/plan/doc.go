// Package plan is the hierarchical search of the seed study made a program:
// measure (here: evaluate) at the smallest scale first, narrow the layout
// families, then grow the survivors to the target GPU count. Search walks
// layouts (FSDP degree, replicas, EP, sharding options), checkpointing
// policies and local batches against an Evaluator, sizing each family's
// largest local batch by memory; SimEvaluator is the evaluator backed by
// the virtual-time simulator. The chosen plan exports as a torchtitan job
// (TOML and Python config) for the pinned torchtitan versions; an
// ExportFilter keeps a search to what an export can express and counts
// what it left out.
//
// It imports parallel/sim, parallel/sim/calib, parallel/sim/cost,
// parallel/hw, memory and moe; parallel/titanlog and cmd/moescope import
// it.
package plan
