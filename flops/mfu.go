package flops

// MFU is model FLOPs utilization as a fraction: flopsPerToken·tps/peak,
// with flopsPerToken under any convention and peak the device's dense
// FLOP/s (torchtitan: BF16 dense peak); 0 when peak ≤ 0. It is not
// clamped: a value above 1 means the TPS, the peak or the convention is
// wrong for the run.
func MFU(flopsPerToken, tps, peak float64) float64 {
	if peak <= 0 {
		return 0
	}
	return flopsPerToken * tps / peak
}

// HFU is hardware FLOPs utilization: MFU computed with the hardware
// convention's FLOPs per token (recompute and tile waste included).
func HFU(hardwareFLOPsPerToken, tps, peak float64) float64 {
	return MFU(hardwareFLOPsPerToken, tps, peak)
}
