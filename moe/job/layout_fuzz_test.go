package job

import (
	"encoding/json"
	"testing"

	"github.com/moescope/moescope/moe"
)

// FuzzLayoutJSON: any JSON layout (the published-runs and plan schema) is
// either refused by Resolve or resolved to a layout whose degrees multiply
// to the world (pp × dp_replicate × dp_shard × tp), lie in [1, MaxDegree],
// with etp 1 or tp and ep × expert tp dividing dp_shard × tp (so efsdp is
// whole, and is dp_shard / ep without tp) and, with pp > 1, a built
// schedule, a micro-batch size ≥ 1 and an explicit split (if any) of pp ×
// virtual stages entries; resolving again changes nothing.
func FuzzLayoutJSON(f *testing.F) {
	f.Add([]byte(`{"gpus": 8, "ep": 2}`))
	f.Add([]byte(`{"dp_shard": 4, "dp_replicate": 2, "sharding": "zero2"}`))
	f.Add([]byte(`{"gpus": 4, "sharding": "zero1", "grad_sync_last_only": true}`))
	f.Add([]byte(`{"gpus": 6, "dp_replicate": 4}`))
	f.Add([]byte(`{"gpus": 4294967296, "dp_shard": 4294967296}`))
	f.Add([]byte(`{"gpus": 0, "dp_shard": -1, "ep": -3, "gpus_per_node": 9223372036854775807}`))
	f.Add([]byte(`{"gpus": 16, "pp": 4, "pp_schedule": "Interleaved1F1B"}`))
	f.Add([]byte(`{"gpus": 16, "pp": 2, "pp_layers": [1, 2, 3, 4], "pp_schedule": "Interleaved1F1B"}`))
	f.Add([]byte(`{"gpus": 8, "pp": 2, "pp_schedule": "ZBVZeroBubble", "pp_microbatch_size": 0}`))
	f.Add([]byte(`{"dp_shard": 1048576, "pp": 1048576, "dp_replicate": 1048576}`))
	f.Add([]byte(`{"gpus": 8, "pp_virtual_stages": 2}`))
	f.Add([]byte(`{"gpus": 16, "tp": 2, "ep": 8, "etp": 1, "async_tp": true}`))
	f.Add([]byte(`{"gpus": 16, "tp": 4, "ep": 2, "etp": 4}`))
	f.Add([]byte(`{"dp_shard": 1048576, "dp_replicate": 1048576, "tp": 1048576}`))
	f.Add([]byte(`{"gpus": 8, "tp": 2, "etp": 3}`))
	f.Add([]byte(`{"gpus": 16, "tp": 2, "pp": 2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l Layout
		if json.Unmarshal(b, &l) != nil {
			return
		}
		if l.Resolve() != nil {
			return
		}
		for name, v := range map[string]int{"gpus": l.GPUs, "dp_shard": l.DPShard, "dp_replicate": l.DPReplicate, "ep": l.EP, "tp": l.TP, "etp": l.ETP, "pp": l.Stages()} {
			if v < 1 || v > MaxDegree {
				t.Fatalf("%s resolved to %+v: %s = %d outside [1, %d]", b, l, name, v, MaxDegree)
			}
		}
		if l.Stages()*l.DPReplicate*l.DPShard*l.TP != l.GPUs || (l.ETP != 1 && l.ETP != l.TP) ||
			(l.DPShard*l.TP)%(l.EP*l.ExpertTP()) != 0 || l.ExpertShard()*l.EP*l.ExpertTP() != l.DPShard*l.TP {
			t.Fatalf("%s resolved to the inconsistent %+v", b, l)
		}
		if l.TP == 1 && (l.DPShard%l.EP != 0 || l.ExpertShard() != l.DPShard/l.EP) {
			t.Fatalf("%s: without tp, %+v is not the dp_shard-only expert mesh", b, l)
		}
		if l.Stages() > 1 {
			counts, err := l.PPLayers.Counts()
			if l.PPSchedule.Check() != nil || l.PPMicrobatchSize < 1 || err != nil || counts != nil && len(counts) != l.PipelineStages() ||
				l.PPSchedule.MultiStage() != (l.PPVirtualStages > 1) {
				t.Fatalf("%s resolved to a pipeline layout that does not hold: %+v", b, l)
			}
		} else if l.PPSchedule != "" || l.PPMicrobatchSize != 0 || l.PPVirtualStages != 0 || l.PPLayers != "" {
			t.Fatalf("%s resolved to pipeline options without a pipeline: %+v", b, l)
		}
		again := l
		if err := again.Resolve(); err != nil || again != l {
			t.Fatalf("%s: resolving %+v again gave %+v, %v", b, l, again, err)
		}
	})
}

// FuzzParseAC: moe.ParseAC accepts exactly what it prints: a policy it reads
// prints as a string that reads back to the same policy, with N ≥ 1 for
// layer:N.
func FuzzParseAC(f *testing.F) {
	for _, s := range []string{"none", "selective", "full", "layer:2", "layer:0", "layer:-1", "layer:+3", "layer:007", "layer:99999999999999999999", "Full", "",
		"modules:layernorm", "modules:moe_act,layernorm", "modules:moe,layernorm", "modules:moe,moe", "modules:", "modules:mlp", "modules:layernorm,layernorm"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := moe.ParseAC(s)
		if err != nil {
			return
		}
		if a.Mode == moe.ACLayer && a.Every < 1 {
			t.Fatalf("%q parsed to layer:%d", s, a.Every)
		}
		b, err := moe.ParseAC(a.String())
		if err != nil || b != a {
			t.Fatalf("%q → %v prints %q, which reads back as %v, %v", s, a, a.String(), b, err)
		}
	})
}
