package cost

import "github.com/moescope/moescope/internal/stats"

// NodeSpreadLoss is the share of the mean GPU's rate a synchronous step
// loses to the slowest of nodes nodes whose speeds spread with relative
// standard deviation sd beyond the spread inside one node: sd·E[max of
// nodes standard normals] (0 for one node).
//
// Why a node term: the devices' speed_sd is measured on the GPUs of one
// node (stas00/ml-engineering's MSMF runs, parallel/hw/devices), whose
// source notes that GPUs of different nodes may spread more; ByteDance's
// analysis of 3,079 training jobs (OSDI'25, arXiv 2505.05713) finds the
// slowdowns of large jobs persistent over their steps, as a fixed slowest
// node's would be. No source measures the node-to-node spread, so its
// default is fitted across independent published scaling series
// (parallel/sim/validate's scale-out fit, stored with the bands), and
// calibrate fits it where runs at several node counts tell it apart.
func NodeSpreadLoss(sd float64, nodes int) float64 {
	if nodes <= 1 || sd <= 0 {
		return 0
	}
	return sd * stats.ExpectedMaxNormal(nodes)
}
