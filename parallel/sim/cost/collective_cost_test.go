package cost

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// TestJSONFilesBounded: a cluster or calibration path that is not a small
// file (here 1 MiB + 1 byte of spaces, standing in for /dev/zero, which
// was once read until memory ran out) is refused by size, not parsed.
func TestJSONFilesBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(p, bytes.Repeat([]byte(" "), fileio.MaxJSONFileBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := hw.LoadCluster(p); err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Errorf("LoadCluster: %v", err)
	}
	if _, err := ReadCalibration(p); err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Errorf("ReadCalibration: %v", err)
	}
	if _, err := ParseCalibration([]byte(`{} {}`), "two objects"); err == nil {
		t.Error("calibration with trailing data accepted")
	}
}

// FuzzParseCluster: any input either fails with an error or yields a valid
// cluster whose collective costs are finite and non-negative.
func FuzzParseCluster(f *testing.F) {
	for _, n := range hw.ClusterNames() {
		c, err := hw.LoadCluster(n)
		if err != nil {
			f.Fatal(err)
		}
		b, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"gpus_per_node":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := hw.ParseCluster(data, "fuzz")
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed but invalid: %v", err)
		}
		g := GroupShape{Ranks: 2 * c.GPUsPerNode, Domains: 2, PerDomain: c.GPUsPerNode}
		if c.NVLinkDomain > c.GPUsPerNode {
			g = GroupShape{Ranks: 2 * c.GPUsPerNode, Domains: 1, PerDomain: 2 * c.GPUsPerNode}
		}
		for _, k := range timedCollKinds {
			cc, err := Collective(c, nil, k, g, 1e6)
			if err != nil || !(cc.Seconds() >= 0) || math.IsInf(cc.Seconds(), 0) {
				t.Fatalf("%s: %+v %v", k, cc, err)
			}
		}
	})
}

// Collective times never decrease with message size and never go negative.
func FuzzCollectiveMonotone(f *testing.F) {
	f.Add(uint8(0), uint16(16), uint8(8), 1e6, 2e6)
	f.Add(uint8(2), uint16(512), uint8(1), 1e3, 1e9)
	f.Fuzz(func(t *testing.T, kind uint8, n uint16, k uint8, a, b float64) {
		if n == 0 || k == 0 || !(a >= 0 && b >= a) || math.IsInf(b, 0) {
			return
		}
		per := min(int(k), int(n))
		g := GroupShape{Ranks: int(n), PerDomain: per, Domains: (int(n) + per - 1) / per}
		c := mustCluster(t, "hgx")
		kk := timedCollKinds[int(kind)%len(timedCollKinds)]
		ca, err1 := Collective(c, nil, kk, g, a)
		cb, err2 := Collective(c, nil, kk, g, b)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if ca.Seconds() < 0 || cb.Seconds() < ca.Seconds()*(1-1e-12) {
			t.Fatalf("%s %+v: %g B → %g s, %g B → %g s", kk, g, a, ca.Seconds(), b, cb.Seconds())
		}
	})
}

// timedCollKinds are the collectives the time model prices; schedules emit
// no broadcast or barrier.
var timedCollKinds = []parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce, parallel.CollAllToAll}
