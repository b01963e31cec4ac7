// Package fileio is the one home of file safety for every moescope command
// (DESIGN.md, "Files"): bounded reads, so a device or a pipe named as an
// input is never read forever; atomic writes that never overwrite without
// --force and never leave a partial file behind; and the checks every
// command makes of its outputs before it works (CheckOutputs).
//
// It imports nothing of moescope; everything else may import it.
package fileio
