// Package report draws a plan for the moescope command: the pictures
// `moescope plan --plot DIR` writes (PNG and SVG) and the self-contained HTML
// page `moescope plan --report FILE.html` writes, with the same pictures
// inline; and the names, the step breakdown and the explanation of the
// best plan those and the command's tables share, so that a plan reads the
// same on the terminal and on the page. It also holds the reports of
// `moescope simulate` (Simulation, WriteSimulation) and `moescope flops`
// (Flops, WriteFlops): their JSON shapes and text.
//
// It is the command's, not a library: it knows the command's flags (its
// errors name them) and only cmd/moescope imports it. It is a package of its
// own because plotting and the report page are one concern, drawing a plan,
// and the command is too large to hold it (internal/sizes: no package over
// 4,000 lines); gonum's plot library is imported here and nowhere else.
package report
