package main

import (
	"io"

	"github.com/moescope/moescope/parallel/sim/validate"
)

func init() {
	register(command{"validate", "check the TPS and memory predictions against published training runs (or --runs)", runValidate})
}

func runValidate(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("validate", stderr)
	runsPath := fs.String("runs", "", "JSON array of measured runs in the published-runs schema (source optional), validated instead of the published runs embedded in moescope; the shared table's section is left out")
	jsonOut := fs.Bool("json", false, "print the report as one JSON object instead of tables")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep, err := validate.Runs(*runsPath)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeJSON(stdout, "validate", rep)
	}
	return validate.WriteText(stdout, rep)
}
