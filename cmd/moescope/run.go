package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// command is one subcommand. Each lives in its own file and registers itself
// in init, so adding one touches no shared list.
type command struct {
	name    string
	summary string
	run     func(stdout, stderr io.Writer, args []string) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("moescope: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// errUsage marks an error caused by how the command was called (exit 2).
var errUsage = errors.New("usage")

func exitCode(err error) int {
	if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
		return 2
	}
	return 1
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: moescope COMMAND [flags]   (moescope COMMAND --help or moescope help COMMAND for its usage)")
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}

// run is the whole program: main only maps its error to an exit code.
func run(stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			if len(args) > 2 {
				return fmt.Errorf("%w: help takes one command (got %q)", errUsage, strings.Join(args[1:], " "))
			}
			return runHelp(stdout, stderr, args[1])
		}
		usage(stdout)
		if len(args) == 0 {
			return fmt.Errorf("%w: no command given", errUsage)
		}
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	c, ok := commands[args[0]]
	if !ok {
		return unknownCommand(args[0])
	}
	err := c.run(stdout, stderr, args[1:])
	var h *helpRequest
	if errors.As(err, &h) {
		printHelp(stdout, c.name, h.fs)
		return nil
	}
	return err
}

func unknownCommand(name string) error {
	return fmt.Errorf("%w: unknown command %q (known: %s)", errUsage, name, strings.Join(slices.Sorted(maps.Keys(commands)), ", "))
}

// newFlags makes a subcommand's flag set that prints nothing and returns
// its errors instead of exiting: run prints the help of -h on stdout, and
// parseFlags makes any other error one line (flagError). The writer, the
// command's stderr, is unused: the flag package's own message and usage
// dump are what it replaces.
func newFlags(name string, _ io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("moescope "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args and rejects stray positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return flagError(fs, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

// setFlags names the flags the command line gave, whatever their value
// (flag.FlagSet.Visit): an explicit 0 is not the same as leaving a flag out.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
