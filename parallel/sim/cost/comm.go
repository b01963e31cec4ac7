package cost

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// The collective time model. It follows NCCL's own cost model
// (src/graph/tuning.cc): a collective costs a latency term — a base latency
// plus one per-step latency for each algorithm step on each link class — and
// a bandwidth term, bytes on the wire ÷ bus bandwidth, where bus bandwidth is
// the link rate × the link class's efficiency (the basis nccl-tests reports
// "busbw" on). NCCL picks the cheapest algorithm by its model; so does
// Collective.
//
// Notation: S bytes (the full tensor: all-gather output, reduce-scatter
// input, all-reduce buffer, all-to-all send buffer of one rank), n ranks in
// m NVLink domains with k = n/m ranks each, B_nv = efficiency × NVLink rate
// per GPU, B_net = efficiency × NIC rate per GPU.
//
//	ring all-gather / reduce-scatter: (n−1)/n·S ÷ min(B_nv, k·B_net)
//	ring all-reduce:                2(n−1)/n·S ÷ min(B_nv, k·B_net)
//	  (a ring leaves each domain once per channel; NCCL spreads its channels
//	  over the domain's k NICs, so the network side of a domain carries the
//	  per-rank volume at k·B_net; with m = 1 only the NVLink term remains)
//	tree all-reduce (m > 1):         S ÷ (0.46·min(B_nv, k·B_net))
//	  (NCCL: tree bus bandwidth × 0.92, algorithm bandwidth = half of it)
//	hierarchical (m > 1, k > 1): intra-domain reduce-scatter over k, the
//	  inter-domain collective over m on S/k per rank (k such rings in
//	  parallel, one per local GPU, each on its own NIC), intra-domain
//	  all-gather over k; phases in sequence.
//	all-to-all (uniform): intra (k−1)/n·S over NVLink and inter (n−k)/n·S
//	  over the rank's own NIC, concurrently: max of the two.
//
// Latency, NCCL's ring model: base + (steps − interSteps)·lat_nv +
// interSteps·lat_net with steps = n−1 (2(n−1) for all-reduce) and
// interSteps = m−1 (2(m−1)); tree: base + 2·((k−1)·lat_nv + ⌈log₂ m⌉·lat_net).

// GroupShape is how a communicator's ranks sit on the cluster.
type GroupShape struct {
	Ranks     int // n
	Domains   int // m, NVLink domains spanned
	PerDomain int // k, ranks per domain (the largest count when uneven)
}

// ShapeOf places a group's ranks on the cluster.
func ShapeOf(c *hw.Cluster, ranks []int) GroupShape {
	per := map[int]int{}
	k := 0
	for _, r := range ranks {
		d := c.Domain(r)
		per[d]++
		k = max(k, per[d])
	}
	return GroupShape{Ranks: len(ranks), Domains: len(per), PerDomain: k}
}

// Comm is the modelled time of one collective on one rank.
type Comm struct {
	Kind      parallel.CollKind
	Algorithm string       // "ring", "tree", "hierarchical", "direct" (all-to-all) or "none" (one rank)
	Link      hw.LinkClass // the link class whose bandwidth bounds the transfer
	LatencyS  float64      // latency term, seconds
	// BandwidthS is the bandwidth term at the full bus bandwidth of Link:
	// what stretches when concurrent collectives share that link.
	BandwidthS float64
	WireBytes  float64 // bytes this rank sends
}

// Seconds is the collective's time when it has its links to itself.
func (c Comm) Seconds() float64 { return c.LatencyS + c.BandwidthS }

// commRates holds the bus bandwidths and latencies, optionally scaled by a
// calibration.
type commRates struct {
	nv, net            float64 // bytes/s per GPU at bus efficiency
	base, latNV, latNt float64 // seconds
}

func ratesOf(c *hw.Cluster, cal *Calibration) commRates {
	effNV, effNet := c.NVLinkEfficiency, c.NetEfficiency
	if cal != nil {
		if cal.NVLinkEfficiency > 0 {
			effNV = cal.NVLinkEfficiency
		}
		if cal.NetEfficiency > 0 {
			effNet = cal.NetEfficiency
		}
	}
	return commRates{
		nv: effNV * c.NVLinkBytesPerS(), net: effNet * c.NetBytesPerSPerGPU(),
		base: c.BaseLatencyUS * 1e-6, latNV: c.NVLinkLatencyUS * 1e-6, latNt: c.NetLatencyUS * 1e-6,
	}
}

// Collective models one collective of kind moving S bytes on a group of
// the given shape (S as in the package notes: the full tensor). It returns
// the cheapest of NCCL's algorithms by the model.
func Collective(c *hw.Cluster, cal *Calibration, kind parallel.CollKind, g GroupShape, bytes float64) (Comm, error) {
	switch kind {
	case parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce, parallel.CollAllToAll:
	default:
		// Schedules never emit broadcast or barrier; pricing them as a ring
		// all-gather would be a silent guess.
		return Comm{}, fmt.Errorf("collective %s: no time model (all_gather, reduce_scatter, all_reduce, all_to_all)", kind)
	}
	if g.Ranks < 1 || g.Domains < 1 || g.PerDomain < 1 || g.Domains*g.PerDomain < g.Ranks {
		return Comm{}, fmt.Errorf("collective %s: bad group shape %+v", kind, g)
	}
	if !(bytes >= 0) || math.IsInf(bytes, 0) {
		return Comm{}, fmt.Errorf("collective %s: bytes = %v must be finite and ≥ 0", kind, bytes)
	}
	if g.Ranks == 1 || bytes == 0 {
		return Comm{Kind: kind, Algorithm: "none"}, nil
	}
	r := ratesOf(c, cal)
	if kind == parallel.CollAllToAll {
		n, k := float64(g.Ranks), float64(g.PerDomain)
		return allToAll(r, kind, g, (k-1)/n*bytes, (n-k)/n*bytes), nil
	}
	best := ringCost(r, kind, g, bytes)
	if g.Domains > 1 {
		if kind == parallel.CollAllReduce {
			if t := treeCost(r, g, bytes); t.Seconds() < best.Seconds() {
				best = t
			}
		}
		if g.PerDomain > 1 {
			if h := hierCost(r, kind, g, bytes); h.Seconds() < best.Seconds() {
				best = h
			}
		}
	}
	return best, nil
}

func allToAll(r commRates, kind parallel.CollKind, g GroupShape, intra, inter float64) Comm {
	tNV, tNet := intra/r.nv, inter/r.net
	cc := Comm{Kind: kind, Algorithm: "direct", Link: hw.LinkNVLink, BandwidthS: tNV, WireBytes: intra + inter,
		LatencyS: r.base + r.latNV}
	if g.Domains > 1 {
		cc.LatencyS = r.base + r.latNt
	}
	if tNet > tNV {
		cc.Link, cc.BandwidthS = hw.LinkNet, tNet
	}
	return cc
}

// steps returns NCCL's ring step counts (all steps, network steps).
func ringSteps(kind parallel.CollKind, n, m int) (int, int) {
	if kind == parallel.CollAllReduce {
		return 2 * (n - 1), 2 * (m - 1)
	}
	return n - 1, m - 1
}

func volumeFactor(kind parallel.CollKind, n int) float64 {
	f := float64(n-1) / float64(n)
	if kind == parallel.CollAllReduce {
		return 2 * f
	}
	return f
}

func ringCost(r commRates, kind parallel.CollKind, g GroupShape, bytes float64) Comm {
	n, m := g.Ranks, g.Domains
	vol := volumeFactor(kind, n) * bytes
	bw, link := r.nv, hw.LinkNVLink
	if m > 1 {
		if netBW := float64(g.PerDomain) * r.net; netBW < bw {
			bw, link = netBW, hw.LinkNet
		}
	}
	steps, inter := ringSteps(kind, n, m)
	lat := r.base + float64(steps-inter)*r.latNV + float64(inter)*r.latNt
	return Comm{Kind: kind, Algorithm: "ring", Link: link, LatencyS: lat, BandwidthS: vol / bw, WireBytes: vol}
}

func treeCost(r commRates, g GroupShape, bytes float64) Comm {
	bw, link := r.nv, hw.LinkNVLink
	if netBW := float64(g.PerDomain) * r.net; netBW < bw {
		bw, link = netBW, hw.LinkNet
	}
	lat := r.base + 2*(float64(g.PerDomain-1)*r.latNV+math.Ceil(math.Log2(float64(g.Domains)))*r.latNt)
	return Comm{Kind: parallel.CollAllReduce, Algorithm: "tree", Link: link, LatencyS: lat,
		BandwidthS: bytes / (0.46 * bw), WireBytes: 2 * bytes}
}

func hierCost(r commRates, kind parallel.CollKind, g GroupShape, bytes float64) Comm {
	k, m := g.PerDomain, g.Domains
	// Intra-domain phases over k ranks on the full tensor; inter-domain
	// phase over m ranks on a 1/k slice, k rings in parallel.
	var intraVol, interVol float64
	var intraSteps, interSteps int
	switch kind {
	case parallel.CollAllReduce:
		intraVol = 2 * float64(k-1) / float64(k) * bytes // reduce-scatter + all-gather
		interVol = volumeFactor(parallel.CollAllReduce, m) * bytes / float64(k)
		intraSteps, interSteps = 2*(k-1), 2*(m-1)
	default:
		intraVol = float64(k-1) / float64(k) * bytes
		interVol = volumeFactor(kind, m) * bytes / float64(k)
		intraSteps, interSteps = k-1, m-1
	}
	tNV, tNet := intraVol/r.nv, interVol/r.net
	link := hw.LinkNVLink
	if tNet > tNV {
		link = hw.LinkNet
	}
	lat := 2*r.base + float64(intraSteps)*r.latNV + float64(interSteps)*r.latNt
	return Comm{Kind: kind, Algorithm: "hierarchical", Link: link, LatencyS: lat,
		BandwidthS: tNV + tNet, WireBytes: intraVol + interVol}
}

// P2PSeconds is one point-to-point message of bytes on link class k: the
// cluster's base latency and one hop of k, then the bytes at k's bus
// bandwidth per GPU (a message uses one link; NCCL's p2p path).
func P2PSeconds(cl *hw.Cluster, cal *Calibration, k hw.LinkClass, bytes float64) float64 {
	if bytes == 0 {
		return 0
	}
	r := ratesOf(cl, cal)
	if k == hw.LinkNVLink {
		return r.base + r.latNV + bytes/r.nv
	}
	return r.base + r.latNt + bytes/r.net
}
