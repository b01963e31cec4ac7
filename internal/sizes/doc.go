// Package sizes checks that moescope's Go sources stay small: no file over
// MaxFileLines lines, no function over MaxFuncLines, no package over
// MaxPackageLines. The command internal/sizes/cmd/sizecheck runs Check on the
// module and fails when anything is over.
//
// Why these limits: the project's style (STYLE.md, "Habits for this
// project") is small files named for one concept, and functions that fit on
// a screen. A file past 600 lines holds more than one concept, so its name
// no longer says what is in it; a function past 100 lines no longer fits on
// one screen, so it cannot be read, and checked against the maths its doc
// states, at a glance; a package past 4,000 lines is several packages, and
// the layering test (internal/layering) can only keep apart what lives in
// separate packages. The numbers are where the reviewed code already sits
// comfortably: most files are far below them, and what is above them is due
// a split.
//
// What is measured, so that the numbers mean the same to everyone:
//   - Only non-test files count: a _test.go file may be as long as its
//     table of cases. Generated files (ast.IsGenerated: the "Code generated
//     ... DO NOT EDIT." line) do not count either; their generator is what
//     is read.
//   - A file's lines are its lines as an editor numbers them.
//   - A function (or method) runs from the line of its func keyword to the
//     line of its closing brace, inclusive, as go/token positions give them;
//     its doc comment is not part of it, the function literals inside it
//     are. A function without a body (an assembly stub) is one declaration.
//   - A package is a directory: the sum of its counted files' lines, every
//     build constraint included (the amd64 and the generic file of one
//     kernel are both read by someone).
//   - Directories whose names begin with "_" or "." and those named
//     testdata are skipped, as the go tool skips them (_asm is a module of
//     its own).
//
// It imports nothing of moescope; only its command imports it.
package sizes
