package plan

import (
	"fmt"

	"github.com/moescope/moescope/moe/job"
)

// Context parallelism in the exports, against the pinned schemas:
//   - v0.2.2 (73a0e6979dd1 torchtitan/config/job_config.py, Parallelism):
//     context_parallel_degree, context_parallel_rotate_method
//     ("allgather" | "alltoall") and context_parallel_load_balancer
//     (str | None, "headtail" or "ptrr"; None has no TOML spelling);
//   - main (b5bcd76c66d0 torchtitan/config/configs.py): the degree and
//     the load balancer; the rotate method was removed (torchtitan
//     8e5554449), so only its former default, allgather, is expressed.
//
// Megatron-Core's p2p ring is neither's.

// cpAdmit refuses the CP settings target cannot express, by name.
func cpAdmit(target TorchtitanTarget, l job.Layout) []error {
	if l.CPDegree() == 1 {
		return nil
	}
	var errs []error
	switch {
	case l.CPMethod == job.CPP2P:
		errs = append(errs, fmt.Errorf("cp_method = p2p: Megatron-Core's ring; %s's context parallelism rotates by allgather or alltoall", target))
	case l.CPMethod == job.CPAllToAll && target == TorchtitanPy:
		errs = append(errs, fmt.Errorf("cp_method = alltoall: %s removed context_parallel_rotate_method (allgather only)", target))
	}
	if l.CPLoadBalancer == job.CPNoBalance && target == TorchtitanTOML {
		errs = append(errs, fmt.Errorf("cp_load_balancer = none: %s disables it with None, which a TOML file cannot write", target))
	}
	return errs
}

// cpTOML is the [parallelism] lines of the layout's CP for v0.2.2.
func cpTOML(l job.Layout) string {
	s := fmt.Sprintf("context_parallel_degree = %d\n", l.CPDegree())
	if l.CPDegree() > 1 {
		s += fmt.Sprintf("context_parallel_rotate_method = %q\ncontext_parallel_load_balancer = %q\n", l.CPMethod, l.CPLoadBalancer)
	}
	return s
}

// cpPython is the config lines of the layout's CP for main.
func cpPython(l job.Layout) string {
	s := fmt.Sprintf("    config.parallelism.context_parallel_degree = %d\n", l.CPDegree())
	switch {
	case l.CPDegree() == 1:
	case l.CPLoadBalancer == job.CPNoBalance:
		s += "    config.parallelism.context_parallel_load_balancer = None\n"
	default:
		s += fmt.Sprintf("    config.parallelism.context_parallel_load_balancer = %q\n", l.CPLoadBalancer)
	}
	return s
}
