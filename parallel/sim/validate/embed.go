package validate

import (
	"embed"
	"fmt"

	"github.com/moescope/moescope/parallel/sim/published"
)

// files is the one copy of the published runs (with the config.json
// files their models name by path) and of the shared validation table,
// compiled into the binary so that `moescope validate` needs no checkout.
//
//go:embed testdata/published testdata/validation/published_runs.csv
var files embed.FS

// Published returns the published runs embedded in the binary, read as
// published.Load reads a folder (sources required, runs recorded twice
// refused).
func Published() ([]published.Run, error) {
	runs, err := published.LoadFS(files, "testdata/published")
	if err != nil {
		return nil, fmt.Errorf("the embedded published runs: %w", err)
	}
	return runs, nil
}

// EmbeddedTable returns the embedded copy of the shared validation table
// (published_runs.csv), header first.
func EmbeddedTable() ([][]string, error) {
	f, err := files.Open("testdata/validation/published_runs.csv")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTable(f)
}
