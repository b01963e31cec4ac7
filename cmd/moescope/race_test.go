//go:build race

package main

// raceEnabled: the race detector is on, which makes simulating every
// published run (moescope validate) take minutes.
const raceEnabled = true
