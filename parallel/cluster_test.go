package parallel

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
)

func TestBuiltinClusters(t *testing.T) {
	names := ClusterNames()
	for _, want := range []string{"hgx", "hgx-h100", "hgx-b300", "gb200-nvl72", "gb300-nvl72"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("built-in cluster %q missing from %v", want, names)
		}
	}
	for _, n := range names {
		c, err := LoadCluster(n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if c.Name != n {
			t.Errorf("%s: name %q", n, c.Name)
		}
		// Every number has a source.
		for _, f := range []string{"gpus_per_node", "nvlink_gbps", "nics_per_node", "nic_gbits", "base_latency_us",
			"nvlink_latency_us", "net_latency_us", "nvlink_efficiency", "net_efficiency"} {
			if c.Sources[f] == "" {
				t.Errorf("%s: no source for %s", n, f)
			}
		}
	}
	// DESIGN's hgx default: 8 GPUs per host, one NVLink domain per host, one
	// 400 Gb/s NIC per GPU → 50 GB/s per GPU before efficiency.
	hgx := mustCluster(t, "")
	if hgx.Name != "hgx" || hgx.GPUsPerNode != 8 || hgx.NVLinkDomain != 8 || hgx.NetBytesPerSPerGPU() != 50e9 || hgx.NVLinkGBps != 900 {
		t.Errorf("default cluster: %+v", hgx)
	}
	nvl := mustCluster(t, "gb200-nvl72")
	if nvl.Link(0, 71) != LinkNVLink || nvl.Link(71, 72) != LinkNet || hgx.Link(7, 8) != LinkNet {
		t.Error("link classes")
	}
	if ClusterForGPU("H200") != "hgx-h100" || ClusterForGPU("gb200") != "gb200-nvl72" || ClusterForGPU("b200") != "hgx" ||
		ClusterForGPU("b300") != "hgx-b300" || ClusterForGPU("gb300") != "gb300-nvl72" {
		t.Error("ClusterForGPU")
	}
	// Every device of the registry has a cluster.
	for _, d := range DeviceNames() {
		if _, err := LoadCluster(ClusterForGPU(d)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	// 800 Gb/s per GPU on the B300 generation: 100 GB/s before efficiency.
	if b3 := mustCluster(t, "hgx-b300"); b3.NetBytesPerSPerGPU() != 100e9 {
		t.Errorf("hgx-b300 network %g B/s per GPU", b3.NetBytesPerSPerGPU())
	}
}

func TestClusterFromFile(t *testing.T) {
	dir := t.TempDir()
	good := `{"name":"mine","gpus_per_node":4,"nvlink_gbps":450,"nics_per_node":2,"nic_gbits":200,
		"base_latency_us":8,"nvlink_latency_us":3,"net_latency_us":10,"nvlink_efficiency":0.8,"net_efficiency":0.9}`
	p := filepath.Join(dir, "c.json")
	if err := os.WriteFile(p, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCluster(p)
	if err != nil {
		t.Fatal(err)
	}
	// nvlink_domain defaults to the host; 2 × 200 Gb/s over 4 GPUs = 12.5 GB/s each.
	if c.NVLinkDomain != 4 || c.NetBytesPerSPerGPU() != 12.5e9 {
		t.Errorf("%+v", c)
	}
	for name, doc := range map[string]string{
		"unknown field":   strings.Replace(good, `"name"`, `"nmae"`, 1),
		"zero gpus":       strings.Replace(good, `"gpus_per_node":4`, `"gpus_per_node":0`, 1),
		"domain not mult": strings.Replace(good, `"gpus_per_node":4`, `"gpus_per_node":4,"nvlink_domain":6`, 1),
		"efficiency > 1":  strings.Replace(good, `"net_efficiency":0.9`, `"net_efficiency":1.5`, 1),
		"negative lat":    strings.Replace(good, `"net_latency_us":10`, `"net_latency_us":-1`, 1),
		"not json":        `{`,
		"trailing data":   good + `{}`,
	} {
		if _, err := ParseCluster([]byte(doc), name); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := LoadCluster("no-such-cluster"); err == nil || !strings.Contains(err.Error(), "hgx") {
		t.Errorf("unknown name: %v", err)
	}
	if _, err := LoadCluster(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file accepted")
	}
}

// TestJSONFilesBounded: a cluster or calibration path that is not a small
// file (here 1 MiB + 1 byte of spaces, standing in for /dev/zero, which
// was once read until memory ran out) is refused by size, not parsed.
func TestJSONFilesBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(p, bytes.Repeat([]byte(" "), fileio.MaxJSONFileBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCluster(p); err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Errorf("LoadCluster: %v", err)
	}
	if _, err := ReadCalibration(p); err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Errorf("ReadCalibration: %v", err)
	}
	if _, err := ParseCalibration([]byte(`{} {}`), "two objects"); err == nil {
		t.Error("calibration with trailing data accepted")
	}
}

func TestWithGPUsPerNode(t *testing.T) {
	hgx := mustCluster(t, "hgx")
	c := hgx.WithGPUsPerNode(4)
	if c.GPUsPerNode != 4 || c.NVLinkDomain != 4 || c.NICsPerNode != 4 || c.NetBytesPerSPerGPU() != 50e9 {
		t.Errorf("hgx with 4 per node: %+v", c)
	}
	nvl := mustCluster(t, "gb200-nvl72").WithGPUsPerNode(8)
	if nvl.NVLinkDomain != 72 || nvl.GPUsPerNode != 8 {
		t.Errorf("nvl72 with 8 per node: %+v", nvl)
	}
}

// FuzzParseCluster: any input either fails with an error or yields a valid
// cluster whose collective costs are finite and non-negative.
func FuzzParseCluster(f *testing.F) {
	for _, n := range ClusterNames() {
		b, err := clusterFS.ReadFile("clusters/" + n + ".json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"gpus_per_node":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCluster(data, "fuzz")
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
			cc, err := CollectiveCost(c, nil, k, g, 1e6)
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
		ca, err1 := CollectiveCost(c, nil, kk, g, a)
		cb, err2 := CollectiveCost(c, nil, kk, g, b)
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
var timedCollKinds = []CollKind{CollAllGather, CollReduceScatter, CollAllReduce, CollAllToAll}
