package hw

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
	hgx := builtinCluster(t, "")
	if hgx.Name != "hgx" || hgx.GPUsPerNode != 8 || hgx.NVLinkDomain != 8 || hgx.NetBytesPerSPerGPU() != 50e9 || hgx.NVLinkGBps != 900 {
		t.Errorf("default cluster: %+v", hgx)
	}
	nvl := builtinCluster(t, "gb200-nvl72")
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
	if b3 := builtinCluster(t, "hgx-b300"); b3.NetBytesPerSPerGPU() != 100e9 {
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

// goodCluster gives every required field of a cluster, each in range.
const goodCluster = `{"name":"mine","gpus_per_node":8,"nvlink_gbps":900,"nics_per_node":8,"nic_gbits":400,
	"base_latency_us":8.4,"nvlink_latency_us":3.4,"net_latency_us":14,"nvlink_efficiency":0.8,"net_efficiency":0.9}`

// TestClusterAbsurdLatencyRefused (issue 17, defect 8): a latency of 1e300
// µs printed a 300-digit step time and exited 0; now every latency outside
// [0, 1 s] is refused naming its field, value and range.
func TestClusterAbsurdLatencyRefused(t *testing.T) {
	for _, f := range []string{"base_latency_us", "nvlink_latency_us", "net_latency_us"} {
		for _, v := range []string{"1e300", "1e7", "-1e-300"} {
			doc := regexp.MustCompile(`"`+f+`":[0-9.]+`).ReplaceAllString(goodCluster, `"`+f+`":`+v)
			_, err := ParseCluster([]byte(doc), "t")
			if err == nil || !strings.Contains(err.Error(), f+" = ") || !strings.Contains(err.Error(), "must be in [0, 1e+06] µs") {
				t.Errorf("%s = %s: error %v", f, v, err)
			}
		}
		doc := regexp.MustCompile(`"`+f+`":[0-9.]+`).ReplaceAllString(goodCluster, `"`+f+`":1e6`)
		if _, err := ParseCluster([]byte(doc), "t"); err != nil {
			t.Errorf("%s = 1e6 µs (the bound) refused: %v", f, err)
		}
	}
}

// TestClusterAbsurdBandwidthRefused (issue 17, defect 8): links of 1e-300
// GB/s or Gb/s, efficiencies near 0, are refused with their range.
func TestClusterAbsurdBandwidthRefused(t *testing.T) {
	for _, c := range []struct{ field, v, want string }{
		{"nvlink_gbps", "1e-300", "nvlink_gbps = 1e-300: must be in [1, 10000] GB/s"},
		{"nvlink_gbps", "1e300", "nvlink_gbps = 1e+300: must be in [1, 10000] GB/s"},
		{"nic_gbits", "1e-300", "nic_gbits = 1e-300: must be in [1, 10000] Gb/s"},
		{"nic_gbits", "20000", "nic_gbits = 20000"},
		{"nvlink_efficiency", "1e-300", "nvlink_efficiency = 1e-300: must be in [0.01, 1]"},
		{"net_efficiency", "0.001", "net_efficiency = 0.001: must be in [0.01, 1]"},
	} {
		doc := regexp.MustCompile(`"`+c.field+`":[0-9.]+`).ReplaceAllString(goodCluster, `"`+c.field+`":`+c.v)
		if _, err := ParseCluster([]byte(doc), "t"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s = %s: error %v, want %q", c.field, c.v, err, c.want)
		}
	}
}

// TestClusterMissingLatencyRefused (issue 17, defect 8): a cluster file
// without base_latency_us or net_latency_us (or any other required number)
// was read as 0 µs; now it is an error naming the field. nvlink_domain,
// description and sources may be left out.
func TestClusterMissingLatencyRefused(t *testing.T) {
	if _, err := ParseCluster([]byte(goodCluster), "t"); err != nil {
		t.Fatalf("good cluster refused: %v", err)
	}
	for _, f := range []string{"name", "gpus_per_node", "nvlink_gbps", "nics_per_node", "nic_gbits", "base_latency_us",
		"nvlink_latency_us", "net_latency_us", "nvlink_efficiency", "net_efficiency"} {
		for _, repl := range []string{"", `"` + f + `":null,`} {
			doc := regexp.MustCompile(`"`+f+`":[^,}]+,?`).ReplaceAllString(goodCluster, repl)
			doc = strings.Replace(doc, ",}", "}", 1)
			_, err := ParseCluster([]byte(doc), "t")
			if err == nil || !strings.Contains(err.Error(), f+": required") {
				t.Errorf("%s left out (%s): error %v", f, doc, err)
			}
		}
	}
}

func TestWithGPUsPerNode(t *testing.T) {
	hgx := builtinCluster(t, "hgx")
	c := hgx.WithGPUsPerNode(4)
	if c.GPUsPerNode != 4 || c.NVLinkDomain != 4 || c.NICsPerNode != 4 || c.NetBytesPerSPerGPU() != 50e9 {
		t.Errorf("hgx with 4 per node: %+v", c)
	}
	nvl := builtinCluster(t, "gb200-nvl72").WithGPUsPerNode(8)
	if nvl.NVLinkDomain != 72 || nvl.GPUsPerNode != 8 {
		t.Errorf("nvl72 with 8 per node: %+v", nvl)
	}
}

func builtinCluster(t *testing.T, name string) *Cluster {
	t.Helper()
	c, err := LoadCluster(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
