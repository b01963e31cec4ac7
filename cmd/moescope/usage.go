package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// helpText is what a command's --help prints before its flags: a synopsis
// and example command lines. Every example must run as shown from the
// repository root (usage_test.go runs them all).
type helpText struct {
	synopsis string
	examples []string
}

// helps holds every command's help text, kept apart from the commands'
// files so that a command's flags and its synopsis can change separately.
var helps = map[string]helpText{
	"bench": {"moescope bench [--json] [--model M] [--tokens N] [--threads N] [--experts E] [--top-k K] [--sizes N,…] [--no-gemm] [--no-layer] [--torch SCRIPT]",
		[]string{"moescope bench --model tiny --sizes 256,512"}},
	"calibrate": {"moescope calibrate (--runs RUNS.json | --torchtitan-log LOG… [--job-config CFG]… [--runs-out RUNS.json]) --out CAL.json [--force] [--json]",
		[]string{"moescope calibrate --runs parallel/sim/validate/testdata/published/kempnerforge-mfu-scaling-h200.json --out calibration.json"}},
	"flops": {"moescope flops --model M --seq S [--batch B] [--ac POLICY] [--mtp] [--tile ROWSxCOLS] [--tps T [--gpu G]] [--json]",
		[]string{"moescope flops --model qwen3-30b-a3b --seq 4096"}},
	"grad": {"moescope grad --model M (--weights W | --init SEED [--save W]) [--tokens T.json [--ac POLICY] [--out G.safetensors]] [--force] [--host-memory-gib 16]",
		[]string{"moescope grad --model testdata/torchref/dense/config.json --weights testdata/torchref/dense/model.safetensors --tokens testdata/torchref/dense/tokens.json",
			"moescope grad --model tiny --init 1 --save tiny.safetensors"}},
	"memory": {"moescope memory --model M --gpus N [layout flags] (--lbs B | --max-lbs) --seq S [--ac POLICY] [recipe flags] [--json]",
		[]string{"moescope memory --model qwen3-30b-a3b --gpus 8 --lbs 2 --seq 4096",
			"moescope memory --model qwen3-30b-a3b --gpus 8 --seq 4096 --max-lbs"}},
	"models": {"moescope models [--json]", []string{"moescope models"}},
	"plan": {"moescope plan --model M --gpus N --seq S [--gpu G] [--ac POLICY] [--tp N,…] [--pp N,…] [recipe flags] [--json] [--torchtitan-toml FILE] [--torchtitan-py FILE] [--report FILE]",
		[]string{"moescope plan --model qwen3-30b-a3b --gpus 64 --seq 4096", "moescope plan --model tiny --gpus 2 --seq 64 --json"}},
	"simulate": {"moescope simulate --model M --gpus N [--gpu G] [layout flags] --lbs B --seq S [--ac POLICY] [recipe flags] [--json] [--trace FILE]",
		[]string{"moescope simulate --model qwen3-30b-a3b --gpus 64 --ep 8 --lbs 2 --seq 4096",
			"moescope simulate --model deepseek-v3 --gpu b200 --gpus 512 --pp 8 --ep 8 --lbs 4 --seq 4096"}},
	"sweep": {"moescope sweep --model M --gpu G --gpus N --seq S [--max-jobs J] [--steps K] [recipe flags] --out DIR [--force]",
		[]string{"moescope sweep --model qwen3-30b-a3b --gpu b200 --gpus 512 --seq 4096 --out jobs"}},
	"train": {"moescope train --model M --gpus N [layout flags] [--ac POLICY] --lbs B --seq S --steps K [--grad-accum A] [--seed X] [--json] [--checkpoint DIR] [--resume DIR] [--fail-rank R | --stall-rank R] [--fail-step S] [--collective-timeout D]",
		[]string{"moescope train --model tiny --gpus 4 --ep 2 --lbs 2 --seq 32 --steps 3"}},
	"validate": {"moescope validate [--runs RUNS.json] [--json]",
		[]string{"moescope validate", "moescope validate --runs parallel/sim/validate/testdata/published/kempnerforge-mfu-scaling-h200.json"}},
	"version": {"moescope version   (or moescope --version)", []string{"moescope version"}},
}

// helpRequest is the error of -h or --help: run prints the command's help
// on stdout and exits 0. It is flag.ErrHelp to errors.Is.
type helpRequest struct{ fs *flag.FlagSet }

func (h *helpRequest) Error() string        { return flag.ErrHelp.Error() }
func (h *helpRequest) Is(target error) bool { return target == flag.ErrHelp }

// flagError turns fs.Parse's error into a help request or a one-line usage
// error that names the flag and where the usage is.
func flagError(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return &helpRequest{fs}
	}
	return fmt.Errorf("%w: %v; run '%s --help' for usage", errUsage, err, fs.Name())
}

// printHelp writes a command's synopsis, examples and flags.
func printHelp(w io.Writer, name string, fs *flag.FlagSet) {
	h := helps[name]
	fmt.Fprintf(w, "usage: %s\n\n%s.\n", h.synopsis, commands[name].summary)
	if len(h.examples) > 0 {
		fmt.Fprintf(w, "\nexamples:\n  %s\n", strings.Join(h.examples, "\n  "))
	}
	if fs == nil {
		return
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// runHelp runs `moescope help [CMD]` and `moescope CMD --help`: the
// command parses -h, which yields its flag set.
func runHelp(stdout, stderr io.Writer, name string) error {
	c, ok := commands[name]
	if !ok {
		return unknownCommand(name)
	}
	err := c.run(stdout, stderr, []string{"-h"})
	var h *helpRequest
	if errors.As(err, &h) {
		printHelp(stdout, name, h.fs)
		return nil
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		printHelp(stdout, name, nil)
		return nil
	}
	return err
}
