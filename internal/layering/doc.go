// Package layering holds the test that enforces the direction of imports
// between moescope's packages (DESIGN.md, "Packages and direction of
// imports"). It has no API.
//
// It imports nothing of moescope; nothing imports it.
package layering
