package validate

import (
	"sync"
	"testing"

	"github.com/moescope/moescope/parallel/sim/published"
)

// publishedTables are the embedded runs and their TPS and memory tables,
// computed once for every test of the package that reads them (each
// table simulates or estimates every run: tens of seconds under -race).
var publishedTables = sync.OnceValues(func() (tables, error) {
	runs, err := Published()
	if err != nil {
		return tables{}, err
	}
	tps, err := TPS(runs)
	if err != nil {
		return tables{}, err
	}
	mem, err := Memory(runs)
	if err != nil {
		return tables{}, err
	}
	scale, err := FitScaleOut(runs, PredictAtSpread)
	if err != nil {
		return tables{}, err
	}
	routing, err := FitRouting(runs, PredictAtSkew)
	return tables{runs, tps, mem, scale, routing}, err
})

type tables struct {
	runs    []published.Run
	tps     TPSTable
	mem     MemoryTable
	scale   ScaleOut
	routing Routing
}

// loadTables returns publishedTables or fails the test.
func loadTables(t *testing.T) tables {
	t.Helper()
	tb, err := publishedTables()
	if err != nil {
		t.Fatal(err)
	}
	return tb
}
