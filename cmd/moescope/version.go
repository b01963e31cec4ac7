package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

func init() {
	register(command{"version", "print the module version and the VCS revision this binary was built from", runVersion})
}

func runVersion(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("version", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		// Only a binary built without module support lacks build info.
		_, err := fmt.Fprintln(stdout, "moescope: no build information in this binary")
		return err
	}
	_, err := io.WriteString(stdout, versionText(info))
	return err
}

// versionText is what `moescope version` prints: the main module's version
// (a tag or pseudo-version under go install module@version and, since Go
// 1.24, go build in a clone; "(devel)" otherwise), then the VCS revision
// and commit time the go command stamped, marked when the tree had
// uncommitted changes. go run and go test stamp no revision, nor does a
// build with -buildvcs=false (often set in GOFLAGS, which the binary cannot
// see) or outside a checkout, so that case names them and how to get one
// rather than printing an empty field.
func versionText(info *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "moescope %s (module %s)\n", info.Main.Version, info.Main.Path)
	s := map[string]string{}
	for _, kv := range info.Settings {
		s[kv.Key] = kv.Value
	}
	if rev := s["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision %s", rev)
		if t := s["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " (%s)", t)
		}
		if s["vcs.modified"] == "true" {
			b.WriteString(", with uncommitted changes")
		}
		b.WriteString("\n")
	} else {
		b.WriteString("revision unknown: this binary was built without VCS information (go run and go test record none, " +
			"nor does go build with -buildvcs=false, which GOFLAGS may set (go env GOFLAGS), or outside a git checkout or in a linked worktree); " +
			"go build -buildvcs=true in a clone records it\n")
	}
	fmt.Fprintf(&b, "built with %s\n", info.GoVersion)
	return b.String()
}
