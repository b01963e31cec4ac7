package titanlog

import (
	"fmt"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/published"
)

// Files are the console logs of measured runs as calibrate names them:
// each log with its job config in the same order (Jobs empty: each log's
// printed config), run on Device in Cluster ("" = the device's usual
// cluster), the first Skip logged steps of each dropped.
type Files struct {
	Logs, Jobs []string // --torchtitan-log, --job-config
	Device     hw.Device
	Cluster    string
	Skip       int
}

// maxLogBytes bounds one console log: a long run logging every step is a
// few MiB; a device or pipe must not be read forever.
const maxLogBytes = 256 << 20

// Runs reads each log, with its job config, as one measured run
// (Input.Run), in order; notes say what was skipped. A file that cannot be
// read is an error naming the flag that names it.
func (f Files) Runs() ([]published.Run, []string, error) {
	var runs []published.Run
	var notes []string
	for i, path := range f.Logs {
		data, err := fileio.ReadBounded(path, maxLogBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("--torchtitan-log: %w", err)
		}
		lg, err := Parse(path, data)
		if err != nil {
			return nil, nil, err
		}
		in := Input{Log: lg, Device: f.Device, Cluster: f.Cluster, Skip: f.Skip}
		if len(f.Jobs) > 0 {
			if in.Job, err = ReadJobConfig(f.Jobs[i]); err != nil {
				return nil, nil, fmt.Errorf("--job-config: %w", err)
			}
		}
		r, n, err := in.Run()
		if err != nil {
			return nil, nil, err
		}
		runs = append(runs, r)
		notes = append(notes, n...)
	}
	return runs, notes, nil
}
