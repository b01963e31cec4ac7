package parallel

// Calibration holds named model parameters fitted to measured runs. A zero
// field keeps the model's default. Compute multipliers scale the default
// efficiencies of their op class (1 = unchanged).
type Calibration struct {
	Source string `json:"source,omitempty"`
	// GEMMScale, GroupedScale, AttentionScale, MemoryBoundScale multiply the
	// modelled efficiency of dense GEMMs, grouped expert GEMMs, flash
	// attention and memory-bound ops.
	GEMMScale        float64 `json:"gemm_scale,omitempty"`
	GroupedScale     float64 `json:"grouped_scale,omitempty"`
	AttentionScale   float64 `json:"attention_scale,omitempty"`
	MemoryBoundScale float64 `json:"memory_bound_scale,omitempty"`
	// NVLinkEfficiency and NetEfficiency replace the cluster's bus-bandwidth
	// efficiencies when set.
	NVLinkEfficiency float64 `json:"nvlink_efficiency,omitempty"`
	NetEfficiency    float64 `json:"net_efficiency,omitempty"`
	// AllocatorOverhead replaces the memory model's reserved/allocated
	// overhead fraction when set.
	AllocatorOverhead float64 `json:"allocator_overhead,omitempty"`
	// Fitted names the parameters the fit moved; the others kept defaults.
	Fitted []string `json:"fitted,omitempty"`
	// Residuals are relative TPS errors (predicted/measured − 1) of the
	// runs the fit used, in input order.
	Residuals []float64 `json:"residuals,omitempty"`
}

func scaleOr1(v float64) float64 {
	if v > 0 {
		return v
	}
	return 1
}
