package main

import (
	"fmt"
	"io"

	"github.com/moescope/moescope/parallel/sim/published"
	"github.com/moescope/moescope/parallel/sim/validate"
)

func init() {
	register(command{"validate", "check the TPS and memory predictions against published training runs (or --runs)", runValidate})
}

// embeddedRuns names the published runs compiled into moescope in the
// report.
const embeddedRuns = "the published runs embedded in moescope"

func runValidate(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("validate", stderr)
	runsPath := fs.String("runs", "", "JSON array of measured runs in the published-runs schema (source optional), validated instead of the published runs embedded in moescope; the shared table's section is left out")
	jsonOut := fs.Bool("json", false, "print the report as one JSON object instead of tables")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep, err := validateReport(*runsPath)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeJSON(stdout, "validate", rep)
	}
	return validate.WriteText(stdout, rep)
}

// validateReport validates the runs of runsPath, or without one the
// embedded published runs with the shared validation table's rows left
// out.
func validateReport(runsPath string) (validate.Report, error) {
	var rep validate.Report
	if runsPath != "" {
		runs, err := published.ReadFile(runsPath, false)
		if err == nil {
			rep, err = validate.Validate(runsPath, runs, nil)
		}
		if err != nil {
			return rep, fmt.Errorf("validate --runs: %w", err)
		}
		return rep, nil
	}
	runs, err := validate.Published()
	if err != nil {
		return rep, err
	}
	table, err := validate.EmbeddedTable()
	if err != nil {
		return rep, err
	}
	if rep, err = validate.Validate(embeddedRuns, runs, table); err != nil {
		return rep, fmt.Errorf("validate: %w", err)
	}
	return rep, nil
}
