package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// TestTrainExplicitZeroGPUsRefused (issue 17, defect 11): train --gpus 0
// --dp-shard 1 --lbs 1 ran and exited 0, an explicit 0 read as "unset";
// every layout degree given as 0 is now a usage error naming it, in every
// command with the layout flags.
func TestTrainExplicitZeroGPUsRefused(t *testing.T) {
	base := map[string][]string{
		"train":    {"train", "--model", "tiny", "--peak-gflops", "100", "--lbs", "1", "--seq", "8", "--steps", "1"},
		"memory":   {"memory", "--model", "tiny", "--lbs", "1", "--seq", "8"},
		"simulate": {"simulate", "--model", "tiny", "--lbs", "1", "--seq", "8"},
	}
	for cmd, args := range base {
		for _, c := range []struct {
			flags []string
			want  string
		}{
			{[]string{"--gpus", "0", "--dp-shard", "1"}, "--gpus = 0: must be in [1, 1048576]"},
			{[]string{"--gpus", "1", "--dp-shard", "0"}, "--dp-shard = 0: must be in [1, 1048576]"},
			{[]string{"--gpus", "1", "--dp-replicate", "0"}, "--dp-replicate = 0"},
			{[]string{"--gpus", "1", "--ep", "0"}, "--ep = 0"},
			{[]string{"--gpus", "-1", "--dp-shard", "1"}, "--gpus = -1"},
		} {
			var out, errb bytes.Buffer
			err := run(&out, &errb, append(append([]string{}, args...), c.flags...))
			if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %v: exit %d, error %v, want %q", cmd, c.flags, exitCode(err), err, c.want)
			}
		}
	}
	// Left out, a degree is still derived: --dp-shard 1 alone is one GPU.
	rep := trainJSON(t, "--dp-shard", "1", "--lbs", "1", "--steps", "1")
	if rep.Layout.GPUs != 1 {
		t.Errorf("--dp-shard 1: gpus %d", rep.Layout.GPUs)
	}
}

// TestGPUsPerNodeAbsurdRefused (issue 17, defect 11): memory accepted and
// ignored --gpus-per-node 9223372036854775807; memory now refuses the flag
// (a rank's memory does not depend on hosts), and train, simulate and plan,
// which use it, refuse 0, negatives and more than 65536 GPUs per host.
func TestGPUsPerNodeAbsurdRefused(t *testing.T) {
	if hw.MaxGPUsPerNode != job.MaxGPUsPerNode {
		t.Fatalf("hw.MaxGPUsPerNode %d ≠ job.MaxGPUsPerNode %d", hw.MaxGPUsPerNode, job.MaxGPUsPerNode)
	}
	for _, v := range []string{"9223372036854775807", "8", "0"} {
		_, err := runCmd(t, "memory", "--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "8", "--gpus-per-node", v)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--gpus-per-node = "+v+": not used by memory") {
			t.Errorf("memory --gpus-per-node %s: exit %d, error %v", v, exitCode(err), err)
		}
	}
	for _, args := range [][]string{
		{"train", "--model", "tiny", "--peak-gflops", "100", "--gpus", "2", "--lbs", "1", "--seq", "8", "--steps", "1"},
		{"simulate", "--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "8"},
		{"plan", "--model", "tiny", "--gpus", "8", "--seq", "8"},
	} {
		for _, v := range []string{"9223372036854775807", "65537", "0", "-4"} {
			_, err := runCmd(t, append(append([]string{}, args...), "--gpus-per-node", v)...)
			if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--gpus-per-node = "+v+": must be in [1, 65536]") {
				t.Errorf("%s --gpus-per-node %s: exit %d, error %v", args[0], v, exitCode(err), err)
			}
		}
	}
	// In range, simulate uses it: 4 GPUs per host put 8 ranks on 2 hosts.
	out, err := runCmd(t, "simulate", "--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "8", "--gpus-per-node", "4", "--json")
	if err != nil || !strings.Contains(out, `"gpus_per_node": 4`) {
		t.Errorf("simulate --gpus-per-node 4: %v\n%s", err, out)
	}
}
