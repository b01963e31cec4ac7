package plan

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
)

// TestTorchtitanCPRefused: the CP settings a target cannot express are
// refused by name: Megatron-Core's p2p ring by both, the alltoall rotation
// by main (which removed context_parallel_rotate_method, torchtitan
// 8e5554449), no load balancer by the TOML form (v0.2.2 spells it None).
func TestTorchtitanCPRefused(t *testing.T) {
	for _, c := range []struct {
		target TorchtitanTarget
		method job.CPMethod
		lb     job.CPLoadBalancer
		want   string
	}{
		{TorchtitanTOML, job.CPP2P, job.CPHeadTail, "cp_method = p2p"},
		{TorchtitanPy, job.CPP2P, job.CPHeadTail, "cp_method = p2p"},
		{TorchtitanPy, job.CPAllToAll, job.CPHeadTail, "cp_method = alltoall"},
		{TorchtitanTOML, job.CPAllGather, job.CPNoBalance, "cp_load_balancer = none"},
	} {
		err := TorchtitanAdmit(c.target, torchtitanCPPoint(4, 2, 1, c.method, c.lb), true)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s %s: %v; want an error naming %q", c.target, c.method, c.lb, err, c.want)
		}
	}
	// Main disables the balancer with None.
	e := TorchtitanExport{Model: "llama3-8b", Seq: 4096, Point: torchtitanCPPoint(4, 2, 1, job.CPAllGather, job.CPNoBalance), Compile: exportCompile(0)}
	var buf bytes.Buffer
	if _, err := e.Python(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"config.parallelism.context_parallel_degree = 2\n", "config.parallelism.context_parallel_load_balancer = None\n"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("main's form lacks %q:\n%s", want, buf.String())
		}
	}
}
