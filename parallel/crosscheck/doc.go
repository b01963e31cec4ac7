// Package crosscheck holds the tests that run both backends of one schedule
// side by side: the goroutine ranks of parallel/numeric and the virtual time
// of parallel/sim. Neither backend may import the other, so the test that
// proves they execute the same collectives, in the same order, of the same
// sizes, lives above both. Beside it, the test that memory's timeline and
// the schedule walk the step's one order (job.StepOrder). It has no API.
//
// It imports parallel/numeric, parallel/sim, parallel, memory and moe;
// nothing imports it.
package crosscheck
