package published

import (
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// PrecisionRecipe is the training recipe of the run's precision text: a recipe
// name (job.Precisions), or a published table's own spelling of one, as
// the shared validation table (published_runs.csv) writes them:
//
//	"BF16 …"                                   → bf16
//	"MXFP8 …" (any qualifier)                  → mxfp8
//	"FP8-CS", "… current scaling …"            → fp8-current: TransformerEngine's
//	  Float8CurrentScaling, what Megatron's --fp8-recipe tensorwise selects
//	  (Megatron-LM megatron/core/enums.py Fp8Recipe)
//	"FP8 tensorwise …"                         → fp8-tensorwise (torchao's)
//	"FP8 (fine-grained 1x128/128x128)", "… blockwise …" → fp8-blockwise
//	"FP8 rowwise …"                            → fp8-rowwise (torchao's)
//	"FP8 delayed …"                            → fp8-delayed (TransformerEngine's
//	  DelayedScaling, Megatron's --fp8-recipe delayed)
//	"NVFP4 …"                                  → nvfp4
//
// Anything else, a bare "FP8" included (which recipe?), is an error
// naming the field and the spellings it reads. Whether the recipe is
// priced is the caller's to check (job.Precision.Check).
func (r Run) PrecisionRecipe() (job.Precision, error) {
	t := strings.ToLower(strings.TrimSpace(r.Precision))
	for _, p := range job.Precisions {
		if t == string(p) {
			return p, nil
		}
	}
	switch {
	case strings.HasPrefix(t, "bf16"):
		return job.BF16, nil
	case strings.HasPrefix(t, "mxfp8"):
		return job.MXFP8, nil
	case strings.HasPrefix(t, "nvfp4"):
		return job.NVFP4, nil
	case strings.HasPrefix(t, "fp8-cs"), strings.HasPrefix(t, "fp8") && strings.Contains(t, "current scaling"):
		return job.FP8Current, nil
	case strings.HasPrefix(t, "fp8") && strings.Contains(t, "tensorwise"):
		return job.FP8Tensorwise, nil
	case strings.HasPrefix(t, "fp8") && (strings.Contains(t, "blockwise") || strings.Contains(t, "1x128")):
		return job.FP8Blockwise, nil
	case strings.HasPrefix(t, "fp8") && strings.Contains(t, "rowwise"):
		return job.FP8Rowwise, nil
	case strings.HasPrefix(t, "fp8") && strings.Contains(t, "delayed"):
		return job.FP8Delayed, nil
	}
	return "", moe.FieldError{Field: "precision", Value: r.Precision,
		Allowed: "a recipe (" + strings.Join(job.BF16.Values(), ", ") + ") or a published spelling of one (BF16, MXFP8, FP8-CS or FP8 … current scaling, FP8 tensorwise, FP8 rowwise, FP8 delayed, FP8 … blockwise, NVFP4)"}
}
