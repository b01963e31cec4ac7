package plan

import (
	"fmt"
	"io"
	"strings"
)

// ScriptJob is one job of a sweep's run script.
type ScriptJob struct {
	Name string // the job's name: its log is Name.log beside its config
	// Config is the job config's file name in the sweep's folder: a TOML
	// for TorchtitanTOML, a Python module (a .py file whose stem is an
	// identifier) for TorchtitanPy, whose registry function is Func.
	Config, Func string
	GPUs         int
	GPUsPerHost  int
}

// scriptFlags is the command line every job adds to its config: the
// config printed at start-up (calibrate checks the log against it), the
// steps, and metrics every step (v0.2.2's job.print_config, main's
// debug.print_config; training.steps and metrics.log_freq in both).
func scriptFlags(t TorchtitanTarget, steps int) string {
	pc := "--job.print_config"
	if t == TorchtitanPy {
		pc = "--debug.print_config"
	}
	return fmt.Sprintf("%s --training.steps %d --metrics.log_freq 1", pc, steps)
}

// ScriptCommand is the shell command that runs j for target from the root
// of a torchtitan checkout, $sweep naming the sweep's folder: one host's
// jobs through the checkout's run_train.sh, a job of several hosts
// through torchrun on each (run_train.sh's settings, with $HEAD_HOST the
// rendezvous host). Its console log (rank 0's lines) is teed to
// $sweep/NAME.log.
func ScriptCommand(t TorchtitanTarget, j ScriptJob, steps int) string {
	flags, log := scriptFlags(t, steps), fmt.Sprintf(`"$sweep/%s.log"`, j.Name)
	if hosts := j.GPUs / j.GPUsPerHost; hosts > 1 {
		cfg := fmt.Sprintf(`--job.config_file "$sweep/%s"`, j.Config)
		env := ""
		if t == TorchtitanPy {
			cfg = fmt.Sprintf("--module %s --config %s", strings.TrimSuffix(j.Config, ".py"), j.Func)
			env = `PYTHONPATH="$sweep${PYTHONPATH:+:$PYTHONPATH}" `
		}
		return fmt.Sprintf(`%sPYTORCH_ALLOC_CONF=expandable_segments:True torchrun --nnodes %d --nproc_per_node %d --rdzv_backend c10d `+
			`--rdzv_endpoint "$HEAD_HOST:29500" --local-ranks-filter 0 --role rank --tee 3 -m torchtitan.train %s %s 2>&1 | tee %s`,
			env, hosts, j.GPUsPerHost, cfg, flags, log)
	}
	if t == TorchtitanPy {
		return fmt.Sprintf(`PYTHONPATH="$sweep${PYTHONPATH:+:$PYTHONPATH}" NGPU=%d MODULE=%s CONFIG=%s ./run_train.sh %s 2>&1 | tee %s`,
			j.GPUs, strings.TrimSuffix(j.Config, ".py"), j.Func, flags, log)
	}
	return fmt.Sprintf(`NGPU=%d CONFIG_FILE="$sweep/%s" ./run_train.sh %s 2>&1 | tee %s`, j.GPUs, j.Config, flags, log)
}

// RunScript writes the bash script that runs a sweep's jobs in torchtitan
// for target. Its working directory is the root of a torchtitan checkout
// at the target's commit (it refuses any other), it finds the sweep's
// folder from its own path, and it refuses to start while a job config
// still holds a Placeholder. It runs the one-host jobs in turn, stopping
// at the first that fails; a job of several hosts cannot be started from
// one, so the script gives its command, for each host, in a comment and
// says so when it ends.
func RunScript(w io.Writer, t TorchtitanTarget, jobs []ScriptJob, steps int) error {
	commit, ext := TorchtitanTOMLCommit, "toml"
	if t == TorchtitanPy {
		commit, ext = TorchtitanPyCommit, "py"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#!/usr/bin/env bash\n# moescope sweep: run this folder's jobs in %s (commit %s).\n", t, commit)
	b.WriteString("# Working directory: the root of that torchtitan checkout (where run_train.sh is), e.g.\n")
	b.WriteString("#   cd ~/torchtitan && bash /path/to/this/folder/" + ScriptName(t) + "\n")
	fmt.Fprintf(&b, "# Fill each %q value in the job configs first. Each job's console log is teed to\n", Placeholder+"…>")
	b.WriteString("# JOB.log in this folder, where the sweep's calibrate command reads it.\n")
	b.WriteString("set -euo pipefail\nsweep=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n")
	b.WriteString("if [ ! -f run_train.sh ] || [ ! -d torchtitan ]; then\n")
	b.WriteString("  echo \"run this script from the root of a torchtitan checkout: $PWD has no run_train.sh\" >&2\n  exit 1\nfi\n")
	fmt.Fprintf(&b, "if grep -l %q \"$sweep\"/*.%s; then\n", Placeholder, ext)
	fmt.Fprintf(&b, "  echo \"fill the %s…> values of the files above first\" >&2\n  exit 1\nfi\n", Placeholder)
	var multi []string
	for _, j := range jobs {
		if j.GPUsPerHost < 1 {
			return fmt.Errorf("run script: job %s: %d GPUs per host", j.Name, j.GPUsPerHost)
		}
		cmd := ScriptCommand(t, j, steps)
		if hosts := j.GPUs / j.GPUsPerHost; hosts > 1 {
			fmt.Fprintf(&b, "# %s runs on %d hosts: on each, from its torchtitan checkout, with sweep= this folder's path and\n", j.Name, hosts)
			fmt.Fprintf(&b, "# HEAD_HOST= the first host's address (keep the log of the host with rank 0):\n#   %s\n", cmd)
			multi = append(multi, j.Name)
			continue
		}
		fmt.Fprintf(&b, "echo \"moescope sweep: %s on %d GPUs\" >&2\n%s\n", j.Name, j.GPUs, cmd)
	}
	if len(multi) > 0 {
		fmt.Fprintf(&b, "echo \"moescope sweep: not run here (several hosts; see the comments in $0): %s\" >&2\n", strings.Join(multi, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ScriptName is the file name of the sweep's run script for target.
func ScriptName(t TorchtitanTarget) string {
	if t == TorchtitanPy {
		return "run_main.sh"
	}
	return "run_" + TorchtitanTOMLTag + ".sh"
}
