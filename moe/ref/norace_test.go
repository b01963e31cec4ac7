//go:build !race

package ref

const raceEnabled = false
