package plan

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestTorchtitanPipelineAsyncTP exports async TP inside pipeline stages,
// which both pinned torchtitans run (pipeline_llm parallelizes each
// stage's model chunk, async TP included; v0.2.2 73a0e6979dd1 and main
// b5bcd76c66d0, torchtitan/distributed/pipeline_parallel.py): pp 2 × tp 2
// × dp_shard 4 on 16 GPUs, compiled. v0.2.2's TOML writes
// [parallelism] pipeline_parallel_degree = 2, tensor_parallel_degree = 2,
// enable_async_tensor_parallel = true and a compiled [compile]; main's
// config registry config.compile.enable_async_tensor_parallel = True (its
// CompileConfig field); every key is in the form's schema excerpt and the
// degrees multiply to the GPUs. Under ZBVZeroBubble the TOML form cannot
// express it (v0.2.2's compiled blocks are refused by the zero-bubble
// split, and async TP needs them compiled) and says so naming async_tp;
// main's form writes it. Eager, both refuse async TP.
func TestTorchtitanPipelineAsyncTP(t *testing.T) {
	var tomlSchema torchtitanTOMLSchema
	torchtitanLoad(t, "v0.2.2-job_config.json", &tomlSchema)
	var pySchema torchtitanPySchema
	torchtitanLoad(t, "main-b5bcd76-configs.json", &pySchema)
	pyCompile := map[string]any{}
	if err := json.Unmarshal(pySchema.ConfigFields["compile"], &pyCompile); err != nil {
		t.Fatal(err)
	}
	export := func(sch job.PPSchedule, compile memory.Compile) TorchtitanExport {
		l := job.Layout{GPUs: 16, PP: 2, TP: 2, DPShard: 4, AsyncTP: true, PPSchedule: sch, Sharding: job.ShardFSDP}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		return TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 4, GradAccum: 1},
			Layers: 48, Compile: compile}
	}
	for _, sch := range []job.PPSchedule{job.PP1F1B, job.PPInterleaved1F1B} {
		e := export(sch, memory.Compile{Model: true, Loss: true})
		var buf bytes.Buffer
		if _, err := e.TOML(&buf); err != nil {
			t.Fatalf("%s: TOML: %v", sch, err)
		}
		var doc map[string]map[string]any
		if _, err := toml.Decode(buf.String(), &doc); err != nil {
			t.Fatalf("%s: %v\n%s", sch, err, buf.String())
		}
		for _, sec := range []string{"parallelism", "compile"} {
			for k, v := range doc[sec] {
				typ, ok := tomlSchema.Sections[sec][k]
				if !ok {
					t.Errorf("%s: [%s] %s not in v0.2.2's schema", sch, sec, k)
					continue
				}
				torchtitanCheckValue(t, k, v, typ)
			}
		}
		par := doc["parallelism"]
		rep, shard := par["data_parallel_replicate_degree"].(int64), par["data_parallel_shard_degree"].(int64)
		pp, tp := par["pipeline_parallel_degree"].(int64), par["tensor_parallel_degree"].(int64)
		if rep*shard*pp*tp != 16 || pp != 2 || tp != 2 || par["enable_async_tensor_parallel"] != true || doc["compile"]["enable"] != true {
			t.Errorf("%s: TOML parallelism %v, compile %v; want pp 2 × tp 2 × 4 with async TP, compiled", sch, par, doc["compile"])
		}

		buf.Reset()
		if _, err := e.Python(&buf); err != nil {
			t.Fatalf("%s: Python: %v", sch, err)
		}
		set := regexp.MustCompile(`(?m)^    config\.(\w+)\.(\w+) = (.*?)(  #.*)?$`)
		got := map[string]any{}
		for _, m := range set.FindAllStringSubmatch(buf.String(), -1) {
			got[m[1]+"."+m[2]] = pythonLiteral(m[3])
			if m[1] == "compile" {
				typ, ok := pyCompile[m[2]]
				if !ok {
					t.Errorf("%s: config.compile.%s not in main's schema", sch, m[2])
					continue
				}
				torchtitanCheckValue(t, m[2], pythonLiteral(m[3]), typ)
			}
		}
		if got["compile.enable_async_tensor_parallel"] != true || got["compile.enable"] != true ||
			got["parallelism.pipeline_parallel_degree"] != int64(2) || got["parallelism.tensor_parallel_degree"] != int64(2) {
			t.Errorf("%s: Python fields %v; want compiled async TP at pp 2 × tp 2", sch, got)
		}
	}
	var buf bytes.Buffer
	zb := export(job.PPZBVZeroBubble, memory.Compile{Model: true, Loss: true})
	if _, err := zb.TOML(&buf); err == nil || !strings.Contains(err.Error(), "pp_schedule = ZBVZeroBubble with a compiled model") ||
		!strings.Contains(err.Error(), "async_tp needs the compiled model") {
		t.Errorf("TOML ZBVZeroBubble with async TP: %v; want a refusal naming pp_schedule, compile and async_tp", err)
	}
	buf.Reset()
	if _, err := zb.Python(&buf); err != nil || !strings.Contains(buf.String(), "config.compile.enable_async_tensor_parallel = True") {
		t.Errorf("Python ZBVZeroBubble with async TP: %v\n%s", err, buf.String())
	}
	eager := export(job.PP1F1B, memory.Compile{})
	if _, err := eager.TOML(&buf); err == nil || !strings.Contains(err.Error(), "async_tp = true without a compiled model") {
		t.Errorf("TOML eager: %v; want the async_tp refusal", err)
	}
	if _, err := eager.Python(&buf); err == nil || !strings.Contains(err.Error(), "async_tp = true without a compiled model") {
		t.Errorf("Python eager: %v; want the async_tp refusal", err)
	}
}
