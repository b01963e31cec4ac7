package main

import (
	"fmt"
	"io"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
)

// mtpReport is `moescope flops --mtp`'s count of the multi-token-prediction
// modules (num_nextn_predict_layers), which every other figure leaves out.
type mtpReport struct {
	Modules      int   `json:"modules"`
	ParamsTotal  int64 `json:"params_total"`
	ParamsActive int64 `json:"params_active"`
	// Megatron-LM's num_floating_point_operations with --mtp-num-layers =
	// modules (main model included), the one convention with an MTP term.
	MegatronPerToken float64 `json:"megatron_flops_per_token"`
	MegatronPerStep  int64   `json:"megatron_flops_per_step"`
}

func buildMTP(cfg *moe.Config, s flops.Shape) (*mtpReport, error) {
	if cfg.MTPLayers == 0 {
		return nil, fmt.Errorf("%w: --mtp: %s has no MTP modules (num_nextn_predict_layers = 0)", errUsage, cfg.Name)
	}
	total, active, err := flops.MTPParams(cfg)
	if err != nil {
		return nil, err
	}
	meg, err := flops.MegatronMTPPerStep(cfg, s, 128)
	if err != nil {
		return nil, err
	}
	return &mtpReport{Modules: cfg.MTPLayers, ParamsTotal: total, ParamsActive: active,
		MegatronPerToken: float64(meg) / float64(s.Tokens()), MegatronPerStep: meg}, nil
}

// printMTP says whether the MTP modules are counted, and their count when
// they are.
func printMTP(w io.Writer, r *flopsReport) {
	switch {
	case r.MTP != nil:
		fmt.Fprintf(w, "MTP (--mtp): %d module(s), %s parameters (%s active), not in the figures above; Megatron with them: %s FLOPs per token\n",
			r.MTP.Modules, fmtInt(r.MTP.ParamsTotal), fmtInt(r.MTP.ParamsActive), fmtFLOPs(r.MTP.MegatronPerToken))
	case r.MTPModules > 0:
		fmt.Fprintf(w, "MTP: %d module(s) (num_nextn_predict_layers) not counted: Hugging Face's model ignores them; --mtp counts them\n", r.MTPModules)
	}
}
