package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/golden"
	"github.com/moescope/moescope/moe/job"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
)

// torchtitanTOMLSchema is testdata/torchtitan/v0.2.2-job_config.json.
type torchtitanTOMLSchema struct {
	Commit   string                    `json:"commit"`
	Sections map[string]map[string]any `json:"sections"`
	Flavors  map[string][]string       `json:"flavors"`
}

type torchtitanPySchema struct {
	Commit       string                     `json:"commit"`
	Imports      map[string]string          `json:"imports"`
	ConfigFields map[string]json.RawMessage `json:"config_fields"`
	Registry     map[string][]string        `json:"registry"`
}

func torchtitanLoad(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchtitan", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// torchtitanCheckValue checks a decoded value against a schema type: "int",
// "str", or a list of allowed strings.
func torchtitanCheckValue(t *testing.T, key string, v, typ any) {
	t.Helper()
	switch ty := typ.(type) {
	case string:
		switch ty {
		case "int":
			if _, ok := v.(int64); !ok {
				t.Errorf("%s = %v (%T), want an integer", key, v, v)
			}
		case "str":
			if _, ok := v.(string); !ok {
				t.Errorf("%s = %v (%T), want a string", key, v, v)
			}
		case "bool":
			if _, ok := v.(bool); !ok {
				t.Errorf("%s = %v (%T), want a boolean", key, v, v)
			}
		case "list[str]":
			items, ok := v.([]any)
			if !ok || len(items) == 0 {
				t.Errorf("%s = %v (%T), want a list of strings", key, v, v)
				return
			}
			for _, it := range items {
				torchtitanCheckValue(t, key+"[]", it, "str")
			}
		case "list[list[str]]":
			outer, ok := v.([]any)
			if !ok || len(outer) == 0 {
				t.Errorf("%s = %v (%T), want a list of lists of strings", key, v, v)
				return
			}
			for _, in := range outer {
				items, ok := in.([]any)
				if !ok || len(items) == 0 {
					t.Errorf("%s: %v (%T), want a list of strings", key, in, in)
					continue
				}
				for _, it := range items {
					torchtitanCheckValue(t, key+"[][]", it, "str")
				}
			}
		default:
			t.Fatalf("schema type %q unknown", ty)
		}
	case []any:
		s, ok := v.(string)
		found := false
		for _, a := range ty {
			found = found || (ok && a == s)
		}
		if !found {
			t.Errorf("%s = %v, want one of %v", key, v, ty)
		}
	case map[string]any: // {"list_of": [allowed strings]}
		allowed, _ := ty["list_of"].([]any)
		items, ok := v.([]any)
		if !ok || len(allowed) == 0 {
			t.Errorf("%s = %v (%T), want a list of %v", key, v, v, allowed)
			return
		}
		for _, it := range items {
			torchtitanCheckValue(t, key+"[]", it, allowed)
		}
	default:
		t.Fatalf("schema for %s: %T", key, typ)
	}
}

func torchtitanPoint(rep, shard, ep int, ac moe.AC, lbs, ga int, reshard bool) Point {
	return Point{Layout: job.Layout{GPUs: rep * shard, DPShard: shard, DPReplicate: rep, EP: ep,
		Sharding: job.ShardFSDP, ReshardAfterForward: reshard}, AC: ac, LBS: lbs, GradAccum: ga}
}

// torchtitanTPPoint is torchtitanPoint with tensor parallelism tp (etp,
// async) innermost: gpus = rep × shard × tp.
func torchtitanTPPoint(rep, shard, tp, ep, etp int, async bool, ac moe.AC) Point {
	p := torchtitanPoint(rep, shard, ep, ac, 1, 2, true)
	p.Layout.GPUs *= tp
	p.Layout.TP, p.Layout.ETP, p.Layout.AsyncTP = tp, etp, async
	return p
}

// torchtitanCPPoint is torchtitanPoint with context parallelism cp
// between dp_shard and tp: gpus = shard × cp.
func torchtitanCPPoint(shard, cp, ep int, method job.CPMethod, lb job.CPLoadBalancer) Point {
	p := torchtitanPoint(1, shard, ep, moe.AC{Mode: moe.ACFull}, 1, 1, true)
	p.Layout.GPUs *= cp
	p.Layout.CP, p.Layout.CPMethod, p.Layout.CPLoadBalancer = cp, method, lb
	return p
}

func TestTorchtitanTOML(t *testing.T) {
	var schema torchtitanTOMLSchema
	torchtitanLoad(t, "v0.2.2-job_config.json", &schema)
	if schema.Commit != TorchtitanTOMLCommit {
		t.Fatalf("schema excerpt is of %s, export pinned to %s", schema.Commit, TorchtitanTOMLCommit)
	}
	cases := []struct {
		model   string
		p       Point
		skipped int
	}{
		{"qwen3-30b-a3b", torchtitanPoint(8, 64, 8, moe.AC{Mode: moe.ACSelective}, 2, 4, true), 0},
		{"deepseek-moe-16b", torchtitanPoint(1, 16, 4, moe.AC{Mode: moe.ACFull}, 8, 1, false), 0},
		{"llama3-8b", torchtitanPoint(2, 4, 1, moe.AC{Mode: moe.ACNone}, 1, 1, true), 0},
		{"mixtral-8x7b", torchtitanPoint(1, 32, 8, moe.AC{Mode: moe.ACLayer, Every: 2}, 1, 2, true), 2},
		// dp_shard 1: DDP over all ranks.
		{"qwen3-235b-a22b", torchtitanPoint(16, 1, 1, moe.AC{Mode: moe.ACFull}, 1, 1, true), 0},
		// Tensor parallelism: tp 2 with EP borrowing the tp ranks, async.
		{"qwen3-30b-a3b", torchtitanTPPoint(1, 4, 2, 8, 1, true, moe.AC{Mode: moe.ACSelective}), 0},
		{"llama3-8b", torchtitanTPPoint(2, 2, 4, 1, 1, false, moe.AC{Mode: moe.ACFull}), 0},
		// Context parallelism: cp 4 with EP borrowing dp_shard × cp, the
		// alltoall rotation and ptrr (both v0.2.2's).
		{"qwen3-30b-a3b", torchtitanCPPoint(2, 4, 8, job.CPAllToAll, job.CPPTRR), 0},
	}
	for i, c := range cases {
		e := TorchtitanExport{Model: c.model, Seq: 4096, Point: c.p, Header: []string{"plan " + c.p.String()}, Compile: exportCompile(i)}
		e.ForceBalance = i == len(cases)-1 // --routing balanced: [debug] against the schema
		if i%2 == 1 {
			// A complete job, as the sweep writes: its added keys are
			// checked against the schema like the plan's.
			e.Run = &TorchtitanRun{Name: "job" + strconv.Itoa(i), Steps: 30}
		}
		var buf bytes.Buffer
		skipped, err := e.TOML(&buf)
		if err != nil {
			t.Fatalf("%s: %v", c.model, err)
		}
		if len(skipped) != c.skipped {
			t.Errorf("%s: skipped %v", c.model, skipped)
		}
		if i == 0 {
			golden.Check(t, "plan_torchtitan.toml", buf.Bytes())
		}
		var doc map[string]map[string]any
		if _, err := toml.Decode(buf.String(), &doc); err != nil {
			t.Fatalf("%s: TOML does not parse: %v\n%s", c.model, err, buf.String())
		}
		for sec, keys := range doc {
			want, ok := schema.Sections[sec]
			if !ok {
				t.Errorf("section [%s] not in torchtitan %s's schema", sec, TorchtitanTOMLTag)
				continue
			}
			for k, v := range keys {
				typ, ok := want[k]
				if !ok {
					t.Errorf("[%s] %s not in the schema", sec, k)
					continue
				}
				torchtitanCheckValue(t, sec+"."+k, v, typ)
			}
		}
		if e.Run != nil {
			checkCompleteTOML(t, c.model, doc, e.Run)
		}
		if m, ok := doc["model"]; ok && m["name"] != nil {
			name, flavor := m["name"].(string), m["flavor"].(string)
			found := false
			for _, f := range schema.Flavors[name] {
				found = found || f == flavor
			}
			if !found {
				t.Errorf("%s: flavor %s/%s not in torchtitan's registry %v", c.model, name, flavor, schema.Flavors[name])
			}
		}
		// Round trip: the degrees, batch, policy and compile read back.
		par, tr, ac := doc["parallelism"], doc["training"], doc["activation_checkpoint"]
		if got := tomlCompile(doc["compile"]); got != e.Compile {
			t.Errorf("%s: compile %+v written as %v", c.model, e.Compile, doc["compile"])
		}
		rep, shard := par["data_parallel_replicate_degree"].(int64), par["data_parallel_shard_degree"].(int64)
		tp, cp := par["tensor_parallel_degree"].(int64), par["context_parallel_degree"].(int64)
		if int(cp) != c.p.Layout.CPDegree() || cp > 1 && (par["context_parallel_rotate_method"] != string(c.p.Layout.CPMethod) ||
			par["context_parallel_load_balancer"] != string(c.p.Layout.CPLoadBalancer)) {
			t.Errorf("%s: cp %d, %v, %v written for %+v", c.model, cp, par["context_parallel_rotate_method"], par["context_parallel_load_balancer"], c.p.Layout)
		}
		if int(rep*shard*cp*tp) != c.p.Layout.GPUs || int(tp) != c.p.Layout.TPDegree() || int(par["expert_parallel_degree"].(int64)) != c.p.Layout.EP {
			t.Errorf("%s: degrees %d × %d × tp %d, ep %v do not give %+v", c.model, rep, shard, tp, par["expert_parallel_degree"], c.p.Layout)
		}
		if tp > 1 && (par["expert_tensor_parallel_degree"] != int64(c.p.Layout.ETP) || par["enable_async_tensor_parallel"] != c.p.Layout.AsyncTP) {
			t.Errorf("%s: etp %v, async %v written for %+v", c.model, par["expert_tensor_parallel_degree"], par["enable_async_tensor_parallel"], c.p.Layout)
		}
		if c.p.Layout.DPShard > 1 && (int(rep) != c.p.Layout.DPReplicate || int(shard) != c.p.Layout.DPShard) {
			t.Errorf("%s: degrees %d × %d, want %d × %d", c.model, rep, shard, c.p.Layout.DPReplicate, c.p.Layout.DPShard)
		}
		lbs, gb := tr["local_batch_size"].(int64), tr["global_batch_size"].(int64)
		// torchtitan/train.py: grad_accum = global / (local × dp degree), dp = rep × shard.
		if int(lbs) != c.p.LBS || int(gb/(lbs*rep*shard)) != c.p.GradAccum || gb%(lbs*rep*shard) != 0 {
			t.Errorf("%s: lbs %d global %d do not give lbs %d × accumulation %d", c.model, lbs, gb, c.p.LBS, c.p.GradAccum)
		}
		wantReshard := map[bool]string{true: "default", false: "never"}[c.p.Layout.ReshardAfterForward]
		if par["fsdp_reshard_after_forward"] != wantReshard {
			t.Errorf("%s: reshard %v", c.model, par["fsdp_reshard_after_forward"])
		}
		mode, opt := ac["mode"], ac["selective_ac_option"]
		switch c.p.AC.Mode {
		case moe.ACSelective:
			if mode != "selective" || opt != "op" {
				t.Errorf("%s: per-op selective written as %v/%v", c.model, mode, opt)
			}
		case moe.ACLayer:
			if n, _ := strconv.Atoi(opt.(string)); mode != "selective" || n != c.p.AC.Every {
				t.Errorf("%s: layer:%d written as %v/%v", c.model, c.p.AC.Every, mode, opt)
			}
		default:
			if mode != string(c.p.AC.Mode) || opt != nil {
				t.Errorf("%s: %s written as %v/%v", c.model, c.p.AC, mode, opt)
			}
		}
	}
}

func TestTorchtitanPython(t *testing.T) {
	var schema torchtitanPySchema
	torchtitanLoad(t, "main-b5bcd76-configs.json", &schema)
	if schema.Commit != TorchtitanPyCommit {
		t.Fatalf("schema excerpt is of %s, export pinned to %s", schema.Commit, TorchtitanPyCommit)
	}
	fields := map[string]map[string]any{}
	var acValues []string
	for sec, raw := range schema.ConfigFields {
		if sec == "loss" {
			continue // a constructor's keywords, checked with the loss line below
		}
		if sec == "activation_checkpoint" {
			if err := json.Unmarshal(raw, &acValues); err != nil {
				t.Fatal(err)
			}
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		fields[sec] = m
	}
	importRE := regexp.MustCompile(`^from ([\w.]+) import (\w+)$`)
	setRE := regexp.MustCompile(`^    config\.(\w+)\.(\w+) = ("[^"]*"|\d+|True|False|\[.*\])(  #.*)?$`)
	// Trainer.Config's own fields (the schema's "trainer").
	topRE := regexp.MustCompile(`^    config\.(\w+) = ("[^"]*"|\d+|True|False)(  #.*)?$`)
	acRE := regexp.MustCompile(`^    config\.activation_checkpoint = (.+)$`)
	floatRE := regexp.MustCompile(`=\d+(\.\d+)?\)$`)
	// The loss line wraps the registry's cross-entropy in N chunks, or
	// unwraps it: ChunkedLossWrapper.Config's keywords must be the schema's.
	var lossSchema map[string]map[string]string
	if err := json.Unmarshal(schema.ConfigFields["loss"], &lossSchema); err != nil {
		t.Fatal(err)
	}
	lossRE := regexp.MustCompile(`^    config\.loss = (?:ChunkedLossWrapper\.Config\(loss_fn=(.+), num_chunks=(\d+)\)|(getattr\(config\.loss, "loss_fn", config\.loss\))(  #.*)?)$`)
	for i, c := range []struct {
		model string
		p     Point
		skip  int
	}{
		{"qwen3-30b-a3b", torchtitanPoint(8, 64, 8, moe.AC{Mode: moe.ACSelective}, 2, 4, true), 0},
		{"deepseek-moe-16b", torchtitanPoint(1, 16, 4, moe.AC{Mode: moe.ACNone}, 8, 1, false), 0},
		{"olmoe-1b-7b", torchtitanPoint(2, 8, 1, moe.AC{Mode: moe.ACFull}, 4, 1, true), 1},
		// tp 2, EP borrowing the tp ranks (main's only EP rule), async TP
		// under the compile settings (exportCompile(3) compiles).
		{"qwen3-30b-a3b", torchtitanTPPoint(1, 8, 2, 8, 1, true, moe.AC{Mode: moe.ACSelective}), 0},
		// cp 2, the default rotation (main has no other) and balancer.
		{"llama3-8b", torchtitanCPPoint(4, 2, 1, job.CPAllGather, job.CPHeadTail), 0},
		// memory budget 0.5: MemoryBudgetAC.Config(memory_budget=0.5), compiled (exportCompile(5)).
		{"qwen3-30b-a3b", torchtitanPoint(1, 8, 8, moe.AC{Mode: moe.ACMemoryBudget, Budget: 0.5}, 2, 1, true), 0},
	} {
		e := TorchtitanExport{Model: c.model, Seq: 4096, Point: c.p, Compile: exportCompile(i), ForceBalance: i == 1}
		if i%2 == 1 {
			e.Run = &TorchtitanRun{Name: "job", Steps: 30} // a complete job, as the sweep writes
			e.LossChunks = 8
		}
		lossLines := 0
		var buf bytes.Buffer
		skipped, err := e.Python(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if len(skipped) != c.skip {
			t.Errorf("%s: skipped %v", c.model, skipped)
		}
		if i == 0 {
			golden.Check(t, "plan_torchtitan.py", buf.Bytes())
		}
		got := map[string]string{}
		for _, line := range strings.Split(buf.String(), "\n") {
			if m := importRE.FindStringSubmatch(line); m != nil {
				if schema.Imports[m[2]] != m[1] {
					found := false
					for _, fn := range schema.Registry[m[1]] {
						found = found || fn == m[2]
					}
					if !found {
						t.Errorf("%s: import %s from %s not in the pinned schema", c.model, m[2], m[1])
					}
				}
			}
			if m := setRE.FindStringSubmatch(line); m != nil {
				typ, ok := fields[m[1]][m[2]]
				if !ok {
					t.Errorf("%s: config.%s.%s not in the pinned schema", c.model, m[1], m[2])
					continue
				}
				v := pythonLiteral(m[3])
				torchtitanCheckValue(t, m[1]+"."+m[2], v, typ)
				got[m[2]] = m[3]
			} else if m := topRE.FindStringSubmatch(line); m != nil {
				typ, ok := fields["trainer"][m[1]]
				if !ok {
					t.Errorf("%s: config.%s not in the pinned schema", c.model, m[1])
					continue
				}
				torchtitanCheckValue(t, m[1], pythonLiteral(m[2]), typ)
				got[m[1]] = m[2]
			} else if m := lossRE.FindStringSubmatch(line); m != nil {
				lossLines++
				chunked := m[2] != ""
				if chunked != (e.LossChunks > 1) || (chunked && (m[2] != strconv.Itoa(e.LossChunks) || m[1] != `getattr(config.loss, "loss_fn", config.loss)`)) {
					t.Errorf("%s: loss line %q for %d chunks", c.model, line, e.LossChunks)
				}
				if kw := lossSchema["ChunkedLossWrapper.Config"]; chunked && (kw["loss_fn"] == "" || kw["num_chunks"] != "int") {
					t.Errorf("ChunkedLossWrapper.Config keywords %v not in the pinned schema", kw)
				}
			} else if m := acRE.FindStringSubmatch(line); m != nil {
				// A float keyword's literal matches the schema's type.
				v := floatRE.ReplaceAllString(m[1], "=float)")
				ok := false
				for _, a := range acValues {
					ok = ok || a == v
				}
				if !ok {
					t.Errorf("%s: activation_checkpoint = %s not in %v", c.model, m[1], acValues)
				}
			}
		}
		if lossLines != 1 {
			t.Errorf("%s: %d loss lines, want 1", c.model, lossLines)
		}
		// Token counts: lbs × seq per micro-batch; lbs × dp × accumulation × seq per step.
		l := c.p.Layout
		want := map[string]string{
			"num_tokens_per_microbatch_per_dp_rank": strconv.Itoa(c.p.LBS * 4096),
			"num_tokens_per_train_step":             strconv.Itoa(c.p.LBS * l.DP() * c.p.GradAccum * 4096),
			"tensor_parallel_degree":                strconv.Itoa(l.TPDegree()),
			"max_context_length":                    "4096",
			"data_parallel_replicate_degree":        strconv.Itoa(l.DPReplicate),
			"data_parallel_shard_degree":            strconv.Itoa(l.DPShard),
			"expert_parallel_degree":                strconv.Itoa(l.EP),
			"enable":                                map[bool]string{true: "True", false: "False"}[e.Compile != memory.Compile{}],
		}
		if cc := compileComponents(e.Compile); len(cc) > 0 {
			want["components"] = "[" + strings.Join(cc, ", ") + "]"
		}
		if l.AsyncTP {
			want["enable_async_tensor_parallel"] = "True"
		}
		if e.Run != nil {
			want["steps"] = "30"
			if !strings.HasPrefix(got["hf_assets_path"], `"`+Placeholder) {
				t.Errorf("%s: a complete job's hf_assets_path = %s, want a placeholder", c.model, got["hf_assets_path"])
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %s", c.model, k, got[k], v)
			}
		}
	}
}

func TestTorchtitanAdmit(t *testing.T) {
	base := torchtitanPoint(2, 8, 2, moe.AC{Mode: moe.ACSelective}, 1, 2, true)
	if err := TorchtitanAdmit(TorchtitanTOML, base, true); err != nil {
		t.Errorf("plain FSDP rejected: %v", err)
	}
	for _, c := range []struct {
		edit   func(p *Point)
		target TorchtitanTarget
		field  string
	}{
		{func(p *Point) { p.Layout.Sharding = job.ShardZeRO2 }, TorchtitanTOML, "sharding = zero2"},
		{func(p *Point) { p.Layout.Sharding = job.ShardZeRO1 }, TorchtitanPy, "sharding = zero1"},
		{func(p *Point) { p.Layout.Sharding = job.ShardDDP }, TorchtitanTOML, "sharding = ddp"},
		{func(p *Point) { p.Layout.KeepGathered = true }, TorchtitanTOML, "keep_gathered"},
		{func(p *Point) { p.Layout.AllreduceLastOnly = true }, TorchtitanPy, "allreduce_last_only"},
		{func(p *Point) { p.Layout.GradSyncLastOnly = true }, TorchtitanTOML, "grad_sync_last_only"},
		{func(p *Point) { p.AC = moe.AC{Mode: moe.ACLayer, Every: 2} }, TorchtitanPy, "ac = layer:2"},
		// v0.2.2 compiles MoE blocks by submodule, routed experts eager.
		{func(p *Point) { p.AC = moe.AC{Mode: moe.ACMemoryBudget, Budget: 0.5} }, TorchtitanTOML, "ac = memory_budget:0.5"},
		// Main has no expert_tensor_parallel_degree (parallel_dims.py at b5bcd76).
		{func(p *Point) { *p = torchtitanTPPoint(1, 8, 2, 2, 2, false, p.AC) }, TorchtitanPy, "etp = tp = 2"},
	} {
		p := base
		c.edit(&p)
		err := TorchtitanAdmit(c.target, p, true)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: err = %v, want one naming %q", c.target, err, c.field)
		}
		e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: p}
		var buf bytes.Buffer
		var werr error
		if c.target == TorchtitanTOML {
			_, werr = e.TOML(&buf)
		} else {
			_, werr = e.Python(&buf)
		}
		if werr == nil || buf.Len() != 0 {
			t.Errorf("%s export of %s wrote %d bytes, err %v", c.target, p, buf.Len(), werr)
		}
	}
	// layer:N is expressible in the TOML era.
	p := base
	p.AC = moe.AC{Mode: moe.ACLayer, Every: 2}
	if err := TorchtitanAdmit(TorchtitanTOML, p, true); err != nil {
		t.Errorf("layer:2 for TOML: %v", err)
	}
}

// FuzzTorchtitanTOML checks that every expressible point exports to TOML a
// real parser reads back with the same degrees, batch and policy.
func FuzzTorchtitanTOML(f *testing.F) {
	f.Add(uint16(8), uint16(64), uint16(8), uint16(2), uint16(4), uint8(1), true)
	f.Add(uint16(1), uint16(1), uint16(1), uint16(1), uint16(1), uint8(0), false)
	f.Add(uint16(3), uint16(6), uint16(3), uint16(7), uint16(5), uint8(3), true)
	f.Fuzz(func(t *testing.T, rep, shard, ep, lbs, ga uint16, acIdx uint8, reshard bool) {
		r, s, e := int(rep%64)+1, int(shard%256)+1, int(ep%16)+1
		if s%e != 0 {
			return
		}
		acs := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: int(acIdx%5) + 1}}
		p := torchtitanPoint(r, s, e, acs[int(acIdx)%len(acs)], int(lbs%64)+1, int(ga%64)+1, reshard)
		ex := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: p}
		var buf bytes.Buffer
		if _, err := ex.TOML(&buf); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		var doc struct {
			Parallelism struct {
				Rep   int `toml:"data_parallel_replicate_degree"`
				Shard int `toml:"data_parallel_shard_degree"`
				EP    int `toml:"expert_parallel_degree"`
			} `toml:"parallelism"`
			Training struct {
				LBS    int `toml:"local_batch_size"`
				Global int `toml:"global_batch_size"`
			} `toml:"training"`
		}
		if _, err := toml.Decode(buf.String(), &doc); err != nil {
			t.Fatalf("%s: %v\n%s", p, err, buf.String())
		}
		pp := doc.Parallelism
		if pp.Rep*pp.Shard != p.Layout.GPUs || pp.EP != e || doc.Training.LBS != p.LBS ||
			doc.Training.Global != p.LBS*p.Layout.GPUs*p.GradAccum {
			t.Fatalf("%s: read back %+v", p, doc)
		}
	})
}

// pythonLiteral decodes the literals the Python export writes: an integer,
// a string, True/False, or a list of strings.
func pythonLiteral(lit string) any {
	switch {
	case lit == "True" || lit == "False":
		return lit == "True"
	case strings.HasPrefix(lit, "[["): // a list of lists of strings: JSON as written
		var v []any
		if err := json.Unmarshal([]byte(lit), &v); err != nil {
			return lit
		}
		return v
	case strings.HasPrefix(lit, "["):
		var items []any
		for _, it := range strings.Split(strings.Trim(lit, "[]"), ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, strings.Trim(it, `"`))
			}
		}
		return items
	}
	if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return n
	}
	return strings.Trim(lit, `"`)
}

// exportCompile varies the compile setting over the export cases: the
// planner's default (model and loss) first, then eager, then model only.
func exportCompile(i int) memory.Compile {
	return []memory.Compile{memory.Compiled, {}, {Model: true}}[i%3]
}

// tomlCompile reads a [compile] section back.
func tomlCompile(sec map[string]any) memory.Compile {
	var c memory.Compile
	if on, _ := sec["enable"].(bool); !on {
		return c
	}
	items, _ := sec["components"].([]any)
	for _, it := range items {
		c.Model = c.Model || it == "model"
		c.Loss = c.Loss || it == "loss"
	}
	return c
}

// torchtitanSchemas loads v0.2.2's TOML schema and main's parallelism
// fields, the pinned schemas both export forms are checked against.
func torchtitanSchemas(t *testing.T) (torchtitanTOMLSchema, map[string]any) {
	t.Helper()
	var tomlSchema torchtitanTOMLSchema
	torchtitanLoad(t, "v0.2.2-job_config.json", &tomlSchema)
	var pySchema torchtitanPySchema
	torchtitanLoad(t, "main-b5bcd76-configs.json", &pySchema)
	pyPar := map[string]any{}
	if err := json.Unmarshal(pySchema.ConfigFields["parallelism"], &pyPar); err != nil {
		t.Fatal(err)
	}
	return tomlSchema, pyPar
}

// TestTorchtitanPipeline exports pipeline layouts in both pinned forms:
// every key is in the form's schema excerpt, the degrees multiply to the
// GPUs (pp × replicate × shard), the batch reads back (v0.2.2: local
// batch ÷ pipeline_parallel_microbatch_size micro-batches; main:
// num_pp_microbatches of num_tokens_per_microbatch_per_dp_rank tokens),
// and a split torchtitan would not make itself is written module by
// module, each layer once, the embedding first and the norm and output
// (v0.2.2 "output", main "lm_head") last.
func TestTorchtitanPipeline(t *testing.T) {
	tomlSchema, pyPar := torchtitanSchemas(t)
	const layers = 48
	for _, c := range []struct {
		l         job.Layout
		lbs, ga   int
		fqns      int // stages written module by module (0: torchtitan's own split)
		reshard   string
		schedules string
	}{
		{job.Layout{GPUs: 64, PP: 4, DPShard: 16, EP: 8}, 8, 2, 0, "default", "1F1B"},
		{job.Layout{GPUs: 64, PP: 4, DPShard: 8, DPReplicate: 2, PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 2, ReshardAfterForward: true}, 8, 1, 0, "always", "Interleaved1F1B"},
		{job.Layout{GPUs: 16, PP: 2, PPSchedule: job.PPInterleaved1F1B, PPVirtualStages: 3}, 4, 1, 6, "default", "Interleaved1F1B"},
		{job.Layout{GPUs: 16, PP: 2, PPLayers: "20,28"}, 4, 1, 2, "default", "1F1B"},
		// The zero-bubble schedules under torchtitan's names; ZBV's V
		// placement is torchtitan's own (style "v" from the name), so the
		// stages are written in stage order as for any schedule.
		{job.Layout{GPUs: 16, PP: 2, PPSchedule: job.PPZBVZeroBubble}, 4, 1, 0, "default", "ZBVZeroBubble"},
		{job.Layout{GPUs: 16, PP: 4, PPSchedule: job.PPInterleavedZeroBubble}, 8, 1, 0, "default", "InterleavedZeroBubble"},
	} {
		l := c.l
		l.Sharding = job.ShardFSDP
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		p := Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: c.lbs, GradAccum: c.ga}
		e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: p, Layers: layers}
		par, tr := exportParallelism(t, e, tomlSchema)
		rep, shard, pp := par["data_parallel_replicate_degree"].(int64), par["data_parallel_shard_degree"].(int64), par["pipeline_parallel_degree"].(int64)
		if int(rep*shard*pp) != l.GPUs || int(pp) != l.PP || par["pipeline_parallel_schedule"] != c.schedules || par["fsdp_reshard_after_forward"] != c.reshard {
			t.Errorf("%+v: TOML parallelism %v", l, par)
		}
		lbs, gb, mbs := tr["local_batch_size"].(int64), tr["global_batch_size"].(int64), par["pipeline_parallel_microbatch_size"].(int64)
		if int(lbs) != c.lbs || int(gb) != c.lbs*l.DP()*c.ga || int(mbs) != l.PPMicrobatchSize {
			t.Errorf("%+v: TOML batch lbs %d global %d microbatch %d", l, lbs, gb, mbs)
		}
		checkFQNs(t, "v0.2.2", par["module_fqns_per_model_part"], c.fqns, layers, "output")

		var buf bytes.Buffer
		if _, err := e.Python(&buf); err != nil {
			t.Fatal(err)
		}
		got := pythonSettings(t, buf.String(), pyPar, l)
		micro, _ := l.Microbatches(c.lbs)
		if got["pipeline_parallel_degree"] != int64(l.PP) || got["num_pp_microbatches"] != int64(micro) ||
			got["num_tokens_per_microbatch_per_dp_rank"] != int64(l.PPMicrobatchSize*4096) ||
			got["num_tokens_per_train_step"] != int64(c.lbs*l.DP()*c.ga*4096) || got["pipeline_parallel_schedule"] != c.schedules {
			t.Errorf("%+v: Python fields %v", l, got)
		}
		checkFQNs(t, "main", got["module_fqns_per_model_part"], c.fqns, layers, "lm_head")
	}
}

// checkFQNs checks a written module_fqns_per_model_part (nil when want is 0).
func checkFQNs(t *testing.T, form string, v any, want, layers int, output string) {
	t.Helper()
	if want == 0 {
		if v != nil {
			t.Errorf("%s: module_fqns_per_model_part = %v written for torchtitan's own split", form, v)
		}
		return
	}
	stages, _ := v.([]any)
	if len(stages) != want {
		t.Fatalf("%s: %d stages in module_fqns_per_model_part %v, want %d", form, len(stages), v, want)
	}
	var names []string
	for _, s := range stages {
		for _, n := range s.([]any) {
			names = append(names, n.(string))
		}
	}
	wantNames := []string{"tok_embeddings"}
	for i := range layers {
		wantNames = append(wantNames, "layers."+strconv.Itoa(i))
	}
	wantNames = append(wantNames, "norm", output)
	if strings.Join(names, " ") != strings.Join(wantNames, " ") {
		t.Errorf("%s: modules %v, want %v", form, names, wantNames)
	}
}

// TestTorchtitanAsyncTPNeedsCompile: both torchtitan versions refuse async
// TP without a compiled model (v0.2.2 parallelize_qwen3: "Async TP requires
// torch.compile"; main CompileConfig.__post_init__).
func TestTorchtitanAsyncTPNeedsCompile(t *testing.T) {
	e := TorchtitanExport{Model: "llama3-8b", Seq: 4096, Point: torchtitanTPPoint(1, 4, 2, 1, 1, true, moe.AC{Mode: moe.ACFull})}
	var buf bytes.Buffer
	if _, err := e.TOML(&buf); err == nil || !strings.Contains(err.Error(), "async_tp") {
		t.Errorf("TOML: %v, want an error naming async_tp", err)
	}
	if _, err := e.Python(&buf); err == nil || !strings.Contains(err.Error(), "async_tp") {
		t.Errorf("Python: %v, want an error naming async_tp", err)
	}
	e.Compile = memory.Compile{Model: true}
	if _, err := e.TOML(&buf); err != nil {
		t.Errorf("compiled: %v", err)
	}
	// The planner's Admit refuses the point as the export does, so a
	// search never ends on a plan its export would refuse.
	if err := TorchtitanAdmit(TorchtitanPy, e.Point, false); err == nil || !strings.Contains(err.Error(), "async_tp") {
		t.Errorf("Admit, eager: %v, want an error naming async_tp", err)
	}
	if err := TorchtitanAdmit(TorchtitanPy, e.Point, true); err != nil {
		t.Errorf("Admit, compiled: %v", err)
	}
}

// TestTorchtitanZeroBubbleCompile: torchtitan v0.2.2 compiles each block
// as a torch.compile wrapper (models/llama3/infra/parallelize.py
// apply_compile at 73a0e6979dd1), which PyTorch's zero-bubble schedules
// refuse (schedules.py at 00722e64, _check_torch_compile_compatibility):
// the TOML form refuses a compiled ZBVZeroBubble plan by name; main
// compiles in place (torchtitan/distributed/compile.py at b5bcd76c,
// transformer_block.compile), so its form writes it, and the TOML form
// writes it eager.
func TestTorchtitanZeroBubbleCompile(t *testing.T) {
	l := job.Layout{GPUs: 16, PP: 2, PPSchedule: job.PPZBVZeroBubble, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 4, GradAccum: 1},
		Layers: 48, Compile: memory.Compile{Model: true}}
	var buf bytes.Buffer
	if _, err := e.TOML(&buf); err == nil || !strings.Contains(err.Error(), "pp_schedule = ZBVZeroBubble with a compiled model") {
		t.Errorf("TOML: %v, want a refusal naming pp_schedule and compile", err)
	}
	if _, err := e.Python(&buf); err != nil {
		t.Errorf("Python: %v", err)
	}
	e.Compile = memory.Compile{}
	if _, err := e.TOML(&buf); err != nil {
		t.Errorf("TOML eager: %v", err)
	}
	if err := TorchtitanAdmit(TorchtitanTOML, e.Point, true); err == nil || !strings.Contains(err.Error(), "pp_schedule = ZBVZeroBubble with a compiled model") {
		t.Errorf("Admit, TOML compiled: %v, want a refusal naming pp_schedule and compile", err)
	}
	if err := TorchtitanAdmit(TorchtitanTOML, e.Point, false); err != nil {
		t.Errorf("Admit, TOML eager: %v", err)
	}
}

// TestTorchtitanPipelineTP exports pipelines with tensor parallelism
// inside their stages in both pinned forms. Every key written is in the
// form's schema excerpt; the degrees multiply to the GPUs as both
// ParallelDims._validate require (dp_replicate × dp_shard × cp × tp × pp
// = world, torchtitan 73a0e69 and b5bcd76 distributed/parallel_dims.py);
// the batch reads back over the data-parallel ranks alone (the "batch"
// mesh, dp_replicate × dp_shard: v0.2.2 train.py global_batch_size =
// local_batch_size × batch degree × accumulation; main trainer.py
// num_tokens_per_train_step over num_tokens_per_microbatch_per_dp_rank ×
// num_pp_microbatches × dp degree); v0.2.2 writes etp and async TP beside
// tp; main has no expert_tensor_parallel_degree and refuses etp = tp with
// ep > 1 by name.
func TestTorchtitanPipelineTP(t *testing.T) {
	tomlSchema, pyPar := torchtitanSchemas(t)
	for _, c := range []struct {
		model   string
		layers  int
		l       job.Layout
		lbs, ga int
		pyErr   string // the Python form's refusal ("" = written)
	}{
		// 2 × 1 × 4 × 2 = 16 GPUs; ep 8 borrows dp_shard·tp = 8 (etp 1).
		{"qwen3-30b-a3b", 48, job.Layout{GPUs: 16, PP: 2, DPShard: 4, TP: 2, ETP: 1, EP: 8}, 4, 2, ""},
		// 4 × 1 × 4 × 2 = 32 GPUs; ep·etp = 4 × 2 = dp_shard·tp (efsdp 1).
		{"qwen3-30b-a3b", 48, job.Layout{GPUs: 32, PP: 4, DPShard: 4, TP: 2, ETP: 2, EP: 4, PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 2}, 8, 1,
			"etp = tp = 2 with ep = 4"},
		// A dense model: 2 × 2 × 1 × 4 = 16 GPUs, DDP over the replicas.
		{"llama3-8b", 32, job.Layout{GPUs: 16, PP: 2, DPReplicate: 2, DPShard: 1, TP: 4}, 2, 4, ""},
	} {
		l := c.l
		l.Sharding = job.ShardFSDP
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		p := Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: c.lbs, GradAccum: c.ga}
		e := TorchtitanExport{Model: c.model, Seq: 4096, Point: p, Layers: c.layers}
		par, tr := exportParallelism(t, e, tomlSchema)
		deg := func(k string) int { v, _ := par[k].(int64); return int(v) }
		rep, shard, tp, pp := deg("data_parallel_replicate_degree"), deg("data_parallel_shard_degree"), deg("tensor_parallel_degree"), deg("pipeline_parallel_degree")
		if rep*shard*tp*pp*deg("context_parallel_degree") != l.GPUs || tp != l.TP || pp != l.PP || deg("expert_parallel_degree") != l.EP ||
			deg("expert_tensor_parallel_degree") != l.ETP || par["enable_async_tensor_parallel"] != false {
			t.Errorf("%+v: TOML parallelism %v", l, par)
		}
		if lbs, gb := tr["local_batch_size"].(int64), tr["global_batch_size"].(int64); int(lbs) != c.lbs || int(gb) != c.lbs*rep*shard*c.ga ||
			deg("pipeline_parallel_microbatch_size") != l.PPMicrobatchSize {
			t.Errorf("%+v: TOML batch lbs %d global %d, parallelism %v", l, lbs, gb, par)
		}

		var buf bytes.Buffer
		_, err := e.Python(&buf)
		if c.pyErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.pyErr) {
				t.Errorf("%+v: Python form: %v, want a refusal naming %q", l, err, c.pyErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := pythonSettings(t, buf.String(), pyPar, l)
		micro := int64(c.lbs / l.PPMicrobatchSize)
		if got["tensor_parallel_degree"] != int64(l.TP) || got["pipeline_parallel_degree"] != int64(l.PP) || got["expert_parallel_degree"] != int64(l.EP) ||
			got["num_pp_microbatches"] != micro || got["num_tokens_per_microbatch_per_dp_rank"] != int64(l.PPMicrobatchSize*4096) ||
			got["num_tokens_per_train_step"] != int64(l.PPMicrobatchSize*4096)*micro*int64(l.DPReplicate*l.DPShard*c.ga) {
			t.Errorf("%+v: Python fields %v", l, got)
		}
	}
}

// exportParallelism writes e's v0.2.2 TOML, decodes it, checks every
// [parallelism] key against the pinned schema excerpt tomlSchema and returns the
// [parallelism] and [training] sections.
func exportParallelism(t *testing.T, e TorchtitanExport, tomlSchema torchtitanTOMLSchema) (par, tr map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := e.TOML(&buf); err != nil {
		t.Fatal(err)
	}
	var doc map[string]map[string]any
	if _, err := toml.Decode(buf.String(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	for k, v := range doc["parallelism"] {
		typ, ok := tomlSchema.Sections["parallelism"][k]
		if !ok {
			t.Errorf("%+v: [parallelism] %s not in v0.2.2's schema", e.Point.Layout, k)
			continue
		}
		torchtitanCheckValue(t, k, v, typ)
	}
	return doc["parallelism"], doc["training"]
}

// pythonSettings reads the config.SECTION.KEY = VALUE lines of a Python
// export, checks every parallelism key against main's schema excerpt
// pyPar, and returns the values by key.
func pythonSettings(t *testing.T, src string, pyPar map[string]any, l job.Layout) map[string]any {
	t.Helper()
	set := regexp.MustCompile(`(?m)^    config\.(\w+)\.(\w+) = (.*?)(  #.*)?$`)
	got := map[string]any{}
	for _, m := range set.FindAllStringSubmatch(src, -1) {
		v := pythonLiteral(m[3])
		got[m[2]] = v
		if m[1] == "parallelism" {
			typ, ok := pyPar[m[2]]
			if !ok {
				t.Errorf("%+v: config.parallelism.%s not in main's schema", l, m[2])
				continue
			}
			torchtitanCheckValue(t, m[2], v, typ)
		}
	}
	return got
}

// TestTorchtitanPrecision: both pinned forms write the run's compute and
// reduce types as training.mixed_precision_param and
// mixed_precision_reduce (Literal["bfloat16", "float32"] and
// Literal["float32"] in job_config.py at v0.2.2 and configs.py at
// b5bcd76c), and refuse, naming the flag and value, the storage types they
// cannot express: bf16 reduces, and bf16 gradients or AdamW moments beside
// fp32 parameters (training.dtype = "bfloat16" makes all three bf16).
func TestTorchtitanPrecision(t *testing.T) {
	p := torchtitanPoint(1, 8, 1, moe.AC{Mode: moe.ACFull}, 1, 1, true)
	write := func(target TorchtitanTarget, e TorchtitanExport) (string, error) {
		var buf bytes.Buffer
		var err error
		if target == TorchtitanTOML {
			_, err = e.TOML(&buf)
		} else {
			_, err = e.Python(&buf)
		}
		return buf.String(), err
	}
	f32Compute := moe.DefaultPrecision
	f32Compute.Compute = moe.F32
	for _, c := range []struct {
		prec   moe.Precision
		reduce moe.DType
		toml   string // the [training] lines written, by hand
		py     string
	}{
		{moe.Precision{}, "", "mixed_precision_param = \"bfloat16\"\nmixed_precision_reduce = \"float32\"\n",
			"    config.training.mixed_precision_param = \"bfloat16\"\n    config.training.mixed_precision_reduce = \"float32\"\n"},
		{f32Compute, moe.F32, "mixed_precision_param = \"float32\"\nmixed_precision_reduce = \"float32\"\n",
			"    config.training.mixed_precision_param = \"float32\"\n    config.training.mixed_precision_reduce = \"float32\"\n"},
	} {
		e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: p, Precision: c.prec, ReduceDType: c.reduce}
		for target, want := range map[TorchtitanTarget]string{TorchtitanTOML: c.toml, TorchtitanPy: c.py} {
			got, err := write(target, e)
			if err != nil || !strings.Contains(got, want) {
				t.Errorf("%s, %+v reduce %q: err %v, output lacks\n%s\ngot:\n%s", target, c.prec, c.reduce, err, want, got)
			}
		}
	}
	bf16Grad, bf16Opt := moe.DefaultPrecision, moe.DefaultPrecision
	bf16Grad.Grad, bf16Opt.Optimizer = moe.BF16, moe.BF16
	for _, c := range []struct {
		prec   moe.Precision
		reduce moe.DType
		want   []string
	}{
		{moe.DefaultPrecision, moe.BF16, []string{"reduce_dtype = bf16 (--reduce-dtype)"}},
		// The reduce type defaults to the gradients' (memory.Options).
		{bf16Grad, "", []string{"grad_dtype = bf16 (--grad-dtype)", "reduce_dtype = bf16 (--reduce-dtype)"}},
		{bf16Grad, moe.F32, []string{"grad_dtype = bf16 (--grad-dtype)"}},
		{bf16Opt, "", []string{"optimizer_dtype = bf16 (--optimizer-dtype)"}},
	} {
		e := TorchtitanExport{Model: "qwen3-30b-a3b", Seq: 4096, Point: p, Precision: c.prec, ReduceDType: c.reduce}
		for _, target := range []TorchtitanTarget{TorchtitanTOML, TorchtitanPy} {
			got, err := write(target, e)
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%s, %+v reduce %q: err %v, want one naming %q", target, c.prec, c.reduce, err, w)
				}
			}
			if err != nil && len(c.want) == 1 && strings.Count(err.Error(), "(--") != 1 {
				t.Errorf("%s, %+v reduce %q: %v, want only %q", target, c.prec, c.reduce, err, c.want[0])
			}
			if got != "" {
				t.Errorf("%s, %+v reduce %q: wrote %d bytes of a refused export", target, c.prec, c.reduce, len(got))
			}
		}
	}
}

// checkCompleteTOML checks what a complete job (TorchtitanRun) adds to
// the TOML: the tokenizer folder and the dataset as placeholders, the
// steps, metrics every step, a warm-up within the run, the config printed
// at start-up (so calibrate can check the log against it) and the job's
// own output folder.
func checkCompleteTOML(t *testing.T, model string, doc map[string]map[string]any, r *TorchtitanRun) {
	t.Helper()
	for _, k := range [][2]string{{"model", "hf_assets_path"}, {"training", "dataset"}} {
		if v, _ := doc[k[0]][k[1]].(string); !strings.HasPrefix(v, Placeholder) || !strings.HasSuffix(v, ">") {
			t.Errorf("%s: [%s] %s = %q, want a placeholder %s…>", model, k[0], k[1], v, Placeholder)
		}
	}
	if doc["training"]["steps"] != int64(r.Steps) || doc["metrics"]["log_freq"] != int64(1) || doc["job"]["print_config"] != true {
		t.Errorf("%s: steps %v, log_freq %v, print_config %v; want %d, 1, true", model, doc["training"]["steps"], doc["metrics"]["log_freq"],
			doc["job"]["print_config"], r.Steps)
	}
	if w, _ := doc["lr_scheduler"]["warmup_steps"].(int64); w < 1 || w > int64(r.Steps) {
		t.Errorf("%s: warmup_steps %d outside [1, %d]", model, w, r.Steps)
	}
	if doc["job"]["dump_folder"] != "./outputs/"+r.Name || doc["job"]["description"] != r.Name {
		t.Errorf("%s: [job] %v", model, doc["job"])
	}
}
