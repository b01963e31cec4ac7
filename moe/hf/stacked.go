package hf

import (
	"strings"

	"github.com/moescope/moescope/moe"
)

// Stacked expert tensors (Config.FusedExperts, moe/fused.go): Params lists
// expert e's slice of GPT-OSS's experts.gate_up_proj [E, D, 2F] as
// "experts.gate_up_proj[e]" [D, 2F], and likewise its bias and down_proj;
// a checkpoint file holds the stack under the name without "[e]"
// (GptOssExperts in modeling_gpt_oss.py, transformers 00d4b3d2). Reading
// splits a stack into its slices along dim 0, writing concatenates them.

// fileTensor is one tensor of a checkpoint file: a parameter, or the stack
// of Params' per-expert slices.
type fileTensor struct {
	name   string
	shape  []int
	params []int // indices into cfg.Params() of the slices, in stacking order
	// stacked says the tensor is a stack of per-expert slices, which a
	// checkpoint may hold as MXFP4 blocks and scales (mxfp4.go).
	stacked bool
}

// fileTensors lists the tensors a checkpoint of ps holds, in Params order
// of their first slice.
func fileTensors(ps []moe.Param) []fileTensor {
	var fs []fileTensor
	at := map[string]int{}
	for i, p := range ps {
		base, ok := stackName(p.Name)
		if !ok {
			fs = append(fs, fileTensor{name: p.Name, shape: p.Shape, params: []int{i}})
			continue
		}
		j, seen := at[base]
		if !seen {
			j = len(fs)
			at[base] = j
			fs = append(fs, fileTensor{name: base, shape: append([]int{0}, p.Shape...), stacked: true})
		}
		fs[j].shape[0]++
		fs[j].params = append(fs[j].params, i)
	}
	return fs
}

// stackName returns the stacked tensor's name of a per-expert slice
// "name[e]", or false for any other parameter.
func stackName(param string) (string, bool) {
	if !strings.HasSuffix(param, "]") {
		return "", false
	}
	i := strings.LastIndexByte(param, '[')
	if i < 0 {
		return "", false
	}
	return param[:i], true
}
