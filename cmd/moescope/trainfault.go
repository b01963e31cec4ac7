package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/moescope/moescope/parallel/numeric"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// faultFlags are train's testing aids: they inject a rank fault to show
// what a failing or stalled rank does to a run (numeric.Fault), and set the
// collective timeout that bounds every wait and the watchdog.
type faultFlags struct {
	failRank, stallRank, step int
	timeout                   time.Duration
}

// Collective-timeout bounds: the watchdog calls a computing rank stalled
// after half the timeout without finishing an op, and one op of a model
// train accepts takes well under 5 ms on one core (the tiny model's
// largest, at seq 4096, about 1 ms); a day is past any run train can make.
const (
	minCollectiveTimeout = 10 * time.Millisecond
	maxCollectiveTimeout = 24 * time.Hour
)

func addFaultFlags(fs *flag.FlagSet) *faultFlags {
	f := &faultFlags{}
	fs.IntVar(&f.failRank, "fail-rank", -1, "testing aid: rank R returns an error at the start of step --fail-step; every rank is cancelled and nothing is saved")
	fs.IntVar(&f.stallRank, "stall-rank", -1, "testing aid: rank R stops making progress at the first op of step --fail-step, until the watchdog stops the run (after half of --collective-timeout)")
	fs.IntVar(&f.step, "fail-step", 0, "testing aid: the step of this run, in [1, --steps], at which --fail-rank or --stall-rank strikes (default 1)")
	fs.DurationVar(&f.timeout, "collective-timeout", collective.DefaultTimeout,
		fmt.Sprintf("testing aid: bound on one collective wait, in [%v, %v]; a rank computing for half of it without finishing an op is stopped as stalled", minCollectiveTimeout, maxCollectiveTimeout))
	return f
}

// check validates the flags against the run's world and step count.
func (f *faultFlags) check(world, steps int) error {
	switch {
	case f.timeout < minCollectiveTimeout || f.timeout > maxCollectiveTimeout:
		return fmt.Errorf("%w: --collective-timeout = %v: must be in [%v, %v]", errUsage, f.timeout, minCollectiveTimeout, maxCollectiveTimeout)
	case f.failRank != -1 && (f.failRank < 0 || f.failRank >= world):
		return fmt.Errorf("%w: --fail-rank = %d: must be a rank in [0, %d] (the world has %d ranks)", errUsage, f.failRank, world-1, world)
	case f.stallRank != -1 && (f.stallRank < 0 || f.stallRank >= world):
		return fmt.Errorf("%w: --stall-rank = %d: must be a rank in [0, %d] (the world has %d ranks)", errUsage, f.stallRank, world-1, world)
	case f.failRank >= 0 && f.stallRank >= 0:
		return fmt.Errorf("%w: give at most one of --fail-rank (%d) and --stall-rank (%d)", errUsage, f.failRank, f.stallRank)
	case f.step != 0 && f.failRank < 0 && f.stallRank < 0:
		return fmt.Errorf("%w: --fail-step = %d needs --fail-rank or --stall-rank", errUsage, f.step)
	case f.step != 0 && (f.step < 1 || f.step > steps):
		return fmt.Errorf("%w: --fail-step = %d: must be in [1, %d] (--steps)", errUsage, f.step, steps)
	}
	return nil
}

// fault is the numeric fault the flags ask for, for a run whose first step
// is optimizer step start (0-based); nil for none.
func (f *faultFlags) fault(start int) *numeric.Fault {
	rank, stall := f.failRank, false
	if f.stallRank >= 0 {
		rank, stall = f.stallRank, true
	}
	if rank < 0 {
		return nil
	}
	return &numeric.Fault{Rank: rank, Step: start + max(f.step, 1) - 1, Stall: stall}
}

// stepError explains a failed step: which step (a rank's error does not
// say), the first error, how many ranks it stopped, and that nothing of
// the run was saved, so that a --checkpoint directory keeps the last good
// checkpoint it held. A step that diverged names its step itself.
func stepError(err error, step int, rankErrs []error, ckpt string) error {
	msg := "%w"
	stopped := 0
	for _, e := range rankErrs {
		if e != nil {
			stopped++
		}
	}
	switch {
	case stopped > 0 && stopped == len(rankErrs):
		msg = fmt.Sprintf("step %d: %%w (all %d ranks stopped with it)", step, stopped)
	case stopped > 0:
		msg = fmt.Sprintf("step %d: %%w (%d of %d ranks stopped with it)", step, stopped, len(rankErrs))
	}
	if ckpt != "" {
		msg += fmt.Sprintf("; nothing of this run was saved: --checkpoint %s keeps what it held", ckpt)
	}
	if errors.Is(err, numeric.ErrInjectedFault) {
		msg += " (the fault was injected by --fail-rank)"
	}
	return fmt.Errorf(msg, err)
}
