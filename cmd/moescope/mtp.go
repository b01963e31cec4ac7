package main

import (
	"flag"
	"fmt"
	"math"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
)

// buildMTP counts cfg's MTP modules; mainModel is the main model's
// model-convention count per step.
func buildMTP(cfg *moe.Config, s flops.Shape, mainModel int64) (*report.MTP, error) {
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
	return &report.MTP{Modules: cfg.MTPLayers, ParamsTotal: total, ParamsActive: active,
		MegatronPerToken: float64(meg) / T, MegatronPerStep: meg,
		ModelPerToken: float64(model) / T, ModelPerStep: model,
		ModelTotalPerToken: float64(mainModel+model) / T, ModelTotalPerStep: mainModel + model}, nil
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
