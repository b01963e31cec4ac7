// Package collective connects the goroutine ranks of one mesh: Comm runs
// the collectives of package parallel's groups between them (all-gather,
// reduce-scatter, all-reduce, all-to-all with uneven splits, broadcast,
// barrier), each member's result computed in a fixed group order so that
// runs are reproducible bit for bit; Stats counts the bytes every rank would
// move under NCCL's algorithms, split within and across nodes; mismatched
// collectives and deadlocks are reported with every rank's call, a wait is
// bounded by a timeout, and a watchdog stops a rank that stalls in compute.
//
// It is package numeric's communicator, kept apart from the trainers
// because it is the part of numeric with the cleanest boundary: it knows no
// model, no schedule and no optimizer (it imports only parallel, for
// meshes, groups and collective kinds, and moe, for dtypes), the trainers
// reach it only through its exported calls and Endpoint.Beat (the
// heartbeat their op recorder gives the watchdog), and its tests, fuzz
// tests and example need nothing of theirs. The other candidates are
// woven into the trainer: training checkpoints read its sharded parameters
// and moments, and fault injection lives in the rank's step and recorder.
//
// Only parallel/numeric (and cmd/moescope, for DefaultTimeout) import it;
// it never imports numeric.
package collective
