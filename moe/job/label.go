package job

import "fmt"

// Label is the layout in one line of key=value words, the degrees first
// and then each option that differs from torchtitan's default: the form
// plan listings and messages print.
func (l Layout) Label() string {
	s := fmt.Sprintf("gpus=%d dp_shard=%d dp_replicate=%d ep=%d sharding=%s", l.GPUs, l.DPShard, l.DPReplicate, l.EP, l.Sharding)
	if tp := l.TPDegree(); tp > 1 {
		s += fmt.Sprintf(" tp=%d etp=%d", tp, max(l.ETP, 1))
		if l.AsyncTP {
			s += " async-tp"
		}
	}
	if cp := l.CPDegree(); cp > 1 {
		s += fmt.Sprintf(" cp=%d cp_method=%s cp_load_balancer=%s", cp, l.CPMethod, l.CPLoadBalancer)
	}
	if !l.ReshardAfterForward {
		s += " no-reshard"
	}
	if l.KeepGathered {
		s += " keep-gathered"
	}
	if l.AllreduceLastOnly {
		s += " allreduce-last-only"
	}
	if l.GradSyncLastOnly {
		s += " grad-sync-last-only"
	}
	if l.Stages() > 1 {
		s += fmt.Sprintf(" pp=%d pp_schedule=%s pp_microbatch_size=%d", l.PP, l.PPSchedule, l.PPMicrobatchSize)
		if l.VirtualStages() > 1 {
			s += fmt.Sprintf(" pp_virtual_stages=%d", l.VirtualStages())
		}
	}
	return s
}

// EPBorrowing says, with ep > 1, which ranks EP borrows (", ep 4 (etp 1)
// borrowing dp_shard × tp"; empty without EP): dp_shard's, and the tp
// ranks too at etp 1 (torchtitan v0.2.2's ParallelDims: efsdp =
// dp_shard·cp·tp/(ep·etp)), and with cp > 1 the cp ranks.
func (l Layout) EPBorrowing() string {
	cp := ""
	if l.CPDegree() > 1 {
		cp = " × cp"
	}
	switch {
	case l.EP == 1:
		return ""
	case l.TPDegree() > 1 && l.ExpertTP() == 1:
		return fmt.Sprintf(", ep %d (etp 1) borrowing dp_shard%s × tp", l.EP, cp)
	}
	return fmt.Sprintf(", ep %d (etp %d) borrowing dp_shard%s", l.EP, l.ExpertTP(), cp)
}
