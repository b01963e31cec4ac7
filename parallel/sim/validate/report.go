package validate

import (
	"errors"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/parallel/sim/published"
)

// EmbeddedRuns names the published runs embedded in the binary in a
// report.
const EmbeddedRuns = "the published runs embedded in moescope"

// Report is a whole validation: the TPS and memory tables of a set of
// runs and, for the published runs, the rows of the shared validation
// table left out.
type Report struct {
	Runs  string    `json:"runs"`  // where the runs come from
	Count int       `json:"count"` // how many
	TPS   TPSTable  `json:"tps"`
	Pairs PairTable `json:"ab_pairs"` // runs of one source that differ in settings of the stack only
	// Orders is the tuning sweeps among the runs and how the predictions
	// rank them (Spearman's ρ).
	Orders []Order     `json:"orders"`
	Memory MemoryTable `json:"memory"`
	// ScaleOut is the scaling series among the runs and the spread between
	// nodes fitted to them.
	ScaleOut ScaleOut `json:"scale_out"`
	// Routing is the learned-routing fit: the router spread each source
	// of a learned router beside forced balance implies.
	Routing Routing      `json:"routing"`
	Shared  *SharedTable `json:"shared_table,omitempty"` // absent without a shared table
	// Bands are the uncalibrated 90% bands these runs give, with their
	// leave-one-series-out coverage (for the published runs: what every
	// uncalibrated prediction carries, package band).
	Bands band.Stored `json:"bands"`
}

// Validate builds the report of runs, read from source; table is the
// shared validation table (ReadTable's records), or nil for runs of one's
// own. Any run it cannot predict or estimate is an error naming the run
// and its file: a validation that leaves runs out without saying so would
// misstate the errors.
func Validate(source string, runs []published.Run, table [][]string) (Report, error) {
	if len(runs) == 0 {
		return Report{}, errors.New(source + ": no runs to validate")
	}
	tps, err := TPS(runs)
	if err != nil {
		return Report{}, err
	}
	mem, err := Memory(runs)
	if err != nil {
		return Report{}, err
	}
	scale, err := FitScaleOut(runs, PredictAtSpread)
	if err != nil {
		return Report{}, err
	}
	routing, err := FitRouting(runs, PredictAtSkew)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Runs: source, Count: len(runs), TPS: tps, Pairs: Pairs(tps), Orders: Orders(tps), Memory: mem, ScaleOut: scale, Routing: routing, Bands: Bands(tps, mem, scale, routing)}
	if table != nil {
		s := Shared(runs, table)
		rep.Shared = &s
	}
	return rep, nil
}

// Runs validates the runs of file (File), or the published runs embedded
// in the binary when file is "" (Embedded): a command's --runs.
func Runs(file string) (Report, error) {
	if file != "" {
		return File(file)
	}
	return Embedded()
}

// Embedded validates the published runs embedded in the binary, with the
// embedded shared table's rows they leave out.
func Embedded() (Report, error) {
	runs, err := Published()
	if err != nil {
		return Report{}, err
	}
	table, err := EmbeddedTable()
	if err != nil {
		return Report{}, err
	}
	return Validate(EmbeddedRuns, runs, table)
}

// File validates the runs of one file of one's own (published.ReadFile,
// as `calibrate --runs` reads it: source optional), without a shared
// table.
func File(path string) (Report, error) {
	runs, err := published.ReadFile(path, false)
	if err != nil {
		return Report{}, err
	}
	return Validate(path, runs, nil)
}
