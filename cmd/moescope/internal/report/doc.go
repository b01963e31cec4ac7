// Package report draws a plan for the moescope command. It holds what the
// command's tables and its pictures share, so that a plan reads the same in
// both: the step's critical-path parts in print order and the names of
// layouts and points.
//
// It is the command's, not a library: only cmd/moescope imports it.
package report
