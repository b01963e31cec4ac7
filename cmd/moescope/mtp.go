package main

import (
	"flag"
	"fmt"
	"io"
	"math"

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
	// modules (main model included), the one published convention with an
	// MTP term.
	MegatronPerToken float64 `json:"megatron_flops_per_token"`
	MegatronPerStep  int64   `json:"megatron_flops_per_step"`
	// The modules alone in the model convention (flops.MTPModelPerStep),
	// and the main model's model-convention count with them.
	ModelPerToken      float64 `json:"model_flops_per_token"`
	ModelPerStep       int64   `json:"model_flops_per_step"`
	ModelTotalPerToken float64 `json:"model_total_flops_per_token"`
	ModelTotalPerStep  int64   `json:"model_total_flops_per_step"`
}

// buildMTP counts cfg's MTP modules; mainModel is the main model's
// model-convention count per step.
func buildMTP(cfg *moe.Config, s flops.Shape, mainModel int64) (*mtpReport, error) {
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
	model, err := flops.MTPModelPerStep(cfg, s)
	if err != nil {
		return nil, err
	}
	if model > math.MaxInt64-mainModel {
		return nil, fmt.Errorf("--mtp: the model-convention count with the MTP modules overflows int64 (%d + %d)", mainModel, model)
	}
	T := float64(s.Tokens())
	return &mtpReport{Modules: cfg.MTPLayers, ParamsTotal: total, ParamsActive: active,
		MegatronPerToken: float64(meg) / T, MegatronPerStep: meg,
		ModelPerToken: float64(model) / T, ModelPerStep: model,
		ModelTotalPerToken: float64(mainModel+model) / T, ModelTotalPerStep: mainModel + model}, nil
}

// printMTP says whether the MTP modules are counted, and their count when
// they are.
func printMTP(w io.Writer, r *flopsReport) {
	switch {
	case r.MTP != nil:
		fmt.Fprintf(w, "MTP (--mtp): %d module(s), %s parameters (%s active), not in the figures above; with them, per token: model %s (the modules %s), megatron %s FLOPs\n",
			r.MTP.Modules, fmtInt(r.MTP.ParamsTotal), fmtInt(r.MTP.ParamsActive), fmtFLOPs(r.MTP.ModelTotalPerToken),
			fmtFLOPs(r.MTP.ModelPerToken), fmtFLOPs(r.MTP.MegatronPerToken))
	case r.MTPModules > 0:
		fmt.Fprintf(w, "MTP: %d module(s) (num_nextn_predict_layers) not counted: Hugging Face's model ignores them; --mtp counts them\n", r.MTPModules)
	}
}

// mtpNotModelled is why commands other than flops refuse --mtp.
const mtpNotModelled = "the multi-token-prediction modules are not executed, nor in the memory, step-time and plan models, yet; moescope flops --mtp counts their parameters and FLOPs"

// addMTPFlag registers --mtp on a command that executes the model or
// predicts its memory or time;
// the returned check refuses it when given, so that a run with MTP is not
// predicted silently without its modules.
func addMTPFlag(fs *flag.FlagSet) func() error {
	mtp := fs.Bool("mtp", false, "include the MTP modules (num_nextn_predict_layers): refused here, "+mtpNotModelled)
	return func() error {
		if *mtp {
			return fmt.Errorf("%w: --mtp: not used by %s: %s", errUsage, fs.Name(), mtpNotModelled)
		}
		return nil
	}
}
