package hw

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
)

// Cluster describes the hosts and links a job runs on, never the GPU (that
// comes from the device registry): how many GPUs share a host, how many share
// an NVLink domain (GB200 NVL72: 72 GPUs per domain, 4 per host), the NVLink
// and NIC bandwidths, NCCL's latency terms and the fraction of each link's
// rate a ring collective reaches (bus bandwidth as nccl-tests reports it ÷
// link rate).
//
// Units: GB/s = 1e9 bytes per second each way; Gb/s = 1e9 bits per second;
// latencies in microseconds.
type Cluster struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// GPUsPerNode is GPUs per host (DESIGN's gpus_per_node).
	GPUsPerNode int `json:"gpus_per_node"`
	// NVLinkDomain is GPUs per NVLink domain, a multiple of GPUsPerNode.
	// Optional in a file: 0 or absent = GPUsPerNode.
	NVLinkDomain int `json:"nvlink_domain,omitempty"`
	// NVLinkGBps is each GPU's NVLink bandwidth, GB/s each way.
	NVLinkGBps float64 `json:"nvlink_gbps"`
	// NICsPerNode and NICGbits: the scale-out NICs of a host and the line
	// rate of each, Gb/s each way.
	NICsPerNode int     `json:"nics_per_node"`
	NICGbits    float64 `json:"nic_gbits"`
	// BaseLatencyUS is paid once per collective; NVLinkLatencyUS and
	// NetLatencyUS once per algorithm step on that link class (NCCL's
	// baseLat and hwLat, Simple protocol).
	BaseLatencyUS   float64 `json:"base_latency_us"`
	NVLinkLatencyUS float64 `json:"nvlink_latency_us"`
	NetLatencyUS    float64 `json:"net_latency_us"`
	// NVLinkEfficiency and NetEfficiency are achieved bus bandwidth ÷ link
	// rate, in (0, 1].
	NVLinkEfficiency float64 `json:"nvlink_efficiency"`
	NetEfficiency    float64 `json:"net_efficiency"`
	// Sources gives the origin of each number, keyed by its JSON field.
	Sources map[string]string `json:"sources,omitempty"`
}

// LinkClass says which links a transfer uses: inside an NVLink domain or
// across the scale-out network.
type LinkClass uint8

// Link classes.
const (
	LinkNVLink LinkClass = iota
	LinkNet
	NumLinkClasses
)

func (l LinkClass) String() string {
	if l == LinkNVLink {
		return "nvlink"
	}
	return "network"
}

// MaxGPUsPerNode bounds gpus_per_node (and --gpus-per-node): an HGX host
// holds 8 GPUs, a GB200 NVL72 compute tray 4; 65536 is far above any host.
// job.MaxGPUsPerNode, the layout's bound, is the same (hw imports no moe).
const MaxGPUsPerNode = 1 << 16

// DefaultClusterName is the cluster used when none is given (DESIGN: hgx).
const DefaultClusterName = "hgx"

// ClusterNames lists the built-in clusters, sorted.
func ClusterNames() []string { return registryNames("clusters") }

// ClusterForGPU names the built-in cluster a GPU is usually sold in: Hopper
// parts in an HGX H100/H200 host, B300 in an HGX B300 host, GB200 and GB300
// in their NVL72 racks, everything else (B200, and GPUs with no built-in
// cluster of their own) in the default hgx. Used when the user gives --gpu
// but no --cluster.
func ClusterForGPU(gpu string) string {
	g := strings.ToLower(gpu)
	switch {
	case strings.HasPrefix(g, "h100"), strings.HasPrefix(g, "h200"):
		return "hgx-h100"
	case strings.HasPrefix(g, "b300"):
		return "hgx-b300"
	case strings.HasPrefix(g, "gb200"):
		return "gb200-nvl72"
	case strings.HasPrefix(g, "gb300"):
		return "gb300-nvl72"
	}
	return DefaultClusterName
}

// LoadCluster returns a built-in cluster by name or reads a JSON file of the
// same schema (a value containing a path separator or ending in .json is a
// path). The result is validated.
func LoadCluster(nameOrPath string) (*Cluster, error) {
	if nameOrPath == "" {
		nameOrPath = DefaultClusterName
	}
	var data []byte
	var err error
	if strings.ContainsAny(nameOrPath, `/\`) || strings.HasSuffix(nameOrPath, ".json") {
		data, err = fileio.ReadJSONFile(nameOrPath)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	} else {
		var ok bool
		if data, ok = registryEntry("clusters", nameOrPath); !ok {
			return nil, fmt.Errorf("cluster %q: unknown (built-in: %s; or give a JSON file path)",
				nameOrPath, strings.Join(ClusterNames(), ", "))
		}
	}
	return ParseCluster(data, nameOrPath)
}

// ParseCluster decodes and validates a cluster JSON document; unknown fields
// are errors (a misspelt field would otherwise silently keep a zero), and so
// are missing ones other than description, nvlink_domain and sources
// (missingFields).
func ParseCluster(data []byte, where string) (*Cluster, error) {
	var c Cluster
	if err := decodeStrict(data, &c); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", where, err)
	}
	if c.NVLinkDomain == 0 {
		c.NVLinkDomain = c.GPUsPerNode
	}
	if err := errors.Join(missingFields(data, &c), c.Validate()); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", where, err)
	}
	return &c, nil
}

// Validate reports every out-of-range field at once. Each range is physical,
// with a margin over every system announced (bound).
func (c *Cluster) Validate() error {
	var errs []error
	bad := func(field string, v any, allowed string) {
		errs = append(errs, fmt.Errorf("%s = %v: %s", field, v, allowed))
	}
	// An HGX host holds 8 GPUs, an NVL72 rack 72 in one domain (NVL576
	// announced): 65536 per host and 2^20 per domain have wide margins.
	if c.GPUsPerNode < 1 || c.GPUsPerNode > MaxGPUsPerNode {
		bad("gpus_per_node", c.GPUsPerNode, fmt.Sprintf("must be in [1, %d]", MaxGPUsPerNode))
	}
	if c.NVLinkDomain < 1 || c.NVLinkDomain > 1<<20 {
		bad("nvlink_domain", c.NVLinkDomain, "must be in [1, 1048576]")
	} else if c.GPUsPerNode >= 1 && c.NVLinkDomain%c.GPUsPerNode != 0 {
		bad("nvlink_domain", c.NVLinkDomain, fmt.Sprintf("must be a multiple of gpus_per_node = %d", c.GPUsPerNode))
	}
	// A DGX host has 8 compute NICs; 1024 is 128 times that.
	if c.NICsPerNode < 1 || c.NICsPerNode > 1<<10 {
		bad("nics_per_node", c.NICsPerNode, "must be in [1, 1024]")
	}
	errs = append(errs, checkBounds([]bound{
		// NVLink 5 gives 900 GB/s each way per GPU (GB200 NVL72); 10 TB/s
		// is 11 times that. PCIe 1.0 x16 gave 4 GB/s: no GPU link is
		// under 1 GB/s.
		{"nvlink_gbps", c.NVLinkGBps, 1, 10000, "GB/s each way"},
		// ConnectX-8 gives 800 Gb/s, 1.6 Tb/s NICs are announced; 10 Tb/s
		// is six times that. Gigabit Ethernet is the slowest NIC a host has.
		{"nic_gbits", c.NICGbits, 1, 10000, "Gb/s each way"},
		// NCCL's latencies are 0.6–14 µs (src/graph/tuning.cc baseLat,
		// hwLat); one second per collective or per step is 70 000 times
		// the largest.
		{"base_latency_us", c.BaseLatencyUS, 0, 1e6, "µs (0 to 1 s)"},
		{"nvlink_latency_us", c.NVLinkLatencyUS, 0, 1e6, "µs (0 to 1 s)"},
		{"net_latency_us", c.NetLatencyUS, 0, 1e6, "µs (0 to 1 s)"},
		// Bus bandwidth ÷ link rate: nccl-tests report 0.7–0.95; a ring
		// under 1% of its links is a broken fabric (the same range as
		// calibrate's fitted efficiencies, parallel/sim/cost.Calibration).
		{"nvlink_efficiency", c.NVLinkEfficiency, 0.01, 1, "(a fraction of the link rate)"},
		{"net_efficiency", c.NetEfficiency, 0.01, 1, "(a fraction of the link rate)"},
	})...)
	return errors.Join(errs...)
}

// WithGPUsPerNode returns the cluster with hosts of n GPUs (the
// --gpus-per-node override). A host-sized NVLink domain follows the host;
// a larger domain (NVL72) is kept, rounded up to a multiple of n.
func (c Cluster) WithGPUsPerNode(n int) Cluster {
	if n <= 0 || n == c.GPUsPerNode {
		return c
	}
	if c.NVLinkDomain == c.GPUsPerNode || c.NVLinkDomain < n {
		c.NVLinkDomain = n
	} else if c.NVLinkDomain%n != 0 {
		c.NVLinkDomain += n - c.NVLinkDomain%n
	}
	// NICs per GPU stay as they were.
	perGPU := float64(c.NICsPerNode) / float64(c.GPUsPerNode)
	c.NICsPerNode = max(1, int(math.Round(perGPU*float64(n))))
	c.GPUsPerNode = n
	return c
}

// NVLinkBytesPerS is one GPU's NVLink rate in bytes/s each way, before efficiency.
func (c *Cluster) NVLinkBytesPerS() float64 { return c.NVLinkGBps * 1e9 }

// NetBytesPerSPerGPU is a host's NIC rate divided among its GPUs, bytes/s
// each way, before efficiency.
func (c *Cluster) NetBytesPerSPerGPU() float64 {
	return float64(c.NICsPerNode) * c.NICGbits * 1e9 / 8 / float64(c.GPUsPerNode)
}

// Domain returns the NVLink domain of rank (ranks are placed in order).
func (c *Cluster) Domain(rank int) int { return rank / c.NVLinkDomain }

// Link returns the link class a transfer between two ranks uses.
func (c *Cluster) Link(a, b int) LinkClass {
	if c.Domain(a) == c.Domain(b) {
		return LinkNVLink
	}
	return LinkNet
}
