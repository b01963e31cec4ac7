package memory

import "github.com/moescope/moescope/moe/job"

// Megatron-Core's pipeline buffers (layout pp_impl megatron,
// job.PPMegatron), read in megatron/core/pipeline_parallel/schedules.py
// and p2p_communication.py at Megatron-LM
// 0d8e0714cd29c01e164fe6de9f532182bdffa942 (Megatron-Bridge v0.2.0's
// 3rdparty/Megatron-LM, NeMo 25.11). The order of actions is the one
// job.PipelineOrder gives (job.MegatronWarmup says why); what a rank holds
// for the transfers differs from PyTorch's stage (pipeline.go):
//
//   - No buffer outlives its micro-batch: every receive allocates its
//     tensor (p2p_communication.py 309-323, create_tensor_recv_prev and
//     create_tensor_recv_next: torch.empty of the message shape, per
//     _communicate call). A received activation is appended to its
//     chunk's input_tensors (schedules.py 1361, 1476, 1628) and popped by
//     that micro-batch's backward (1247); it is the stage's input, which
//     the stage's first layer saves, so it is held from its receive to
//     the end of that backward. A received output gradient is appended to
//     output_tensor_grads (1540, 1691, 1770, 1865) and popped by its
//     backward (1249): held from its receive to the end of that backward.
//   - A forward's output is kept in output_tensors (1187) for its grad_fn
//     only: deallocate_output_tensor (135-146) replaces its data by a
//     one-element tensor once it is sent (deallocate_pipeline_outputs,
//     set true by Megatron-LM's training arguments, arguments.py 1287, and
//     by Megatron-Bridge's GPTModelProvider, gpt_provider.py 139 at
//     v0.2.0), and backward starts from it through custom_backward (149).
//   - When each receive is posted: the interleaved schedule with
//     overlap_p2p_comm (Megatron-LM's default, which
//     --no-overlap-p2p-communication turns off; Megatron-Bridge's
//     comm_overlap.py 452-456 at v0.2.0 turns it on when vp > 1) receives
//     the input of the rank's first forward before the warm-up
//     (1361-1364), the input of its next forward right after each forward
//     (warm-up 1472-1476, steady state pp_post_forward 1583-1631), the
//     gradient of its first backward after the last warm-up forward
//     (1509-1540; right before that backward when every forward is in the
//     warm-up, 1769-1777) and the gradient of its next backward right
//     after each backward (pp_post_backward 1654-1694, cool-down
//     1860-1865). A warm-up forward's output is pseudo-freed right after
//     its blocking send (1477); a steady-state one's at the next forward's
//     pp_pre_forward or after the loop (1580, 1758), after its paired
//     backward. The 1F1B schedule
//     (forward_backward_pipelining_without_interleaving) receives each
//     tensor right before the action that uses it (recv_forward 2132 and
//     2162, send_backward_recv_forward 2236, send_forward_recv_backward
//     2206, recv_backward 2258) and pseudo-frees each output after its
//     send (2156; in the steady state 2213, after the paired backward's
//     gradient has been received).
//
// Not modelled: the NCCL work's own reference to a sent tensor until the
// send completes (outputs and input gradients are freed when Megatron
// drops its reference), the extra warm-up forward of
// overlap_moe_expert_parallel_comm (schedules.py 733-734), and the
// interleaved schedule without overlap_p2p_comm (batch_p2p_comm), which
// receives a pair's two tensors after both of its actions (1742-1756).

// p2pKind is what a Megatron p2p event does to one message.
type p2pKind uint8

const (
	p2pRecvInput  p2pKind = iota // allocate the received input of a forward
	p2pRecvGrad                  // allocate the received output gradient of a backward
	p2pFreeOutput                // pseudo-free a forward's output once sent
)

// p2pEvent is one Megatron p2p event, of the message of action a (a
// forward for an input or an output, a backward for a gradient).
type p2pEvent struct {
	kind p2pKind
	a    job.PipeAction
}

// megatronP2P returns, for one pipeline rank's order of actions under
// Megatron-Core's schedule sch with n stages and warm warm-up forwards
// (job.MegatronWarmup), the p2p events to emit before each action
// (before[k]) and after it (after[k]), as the notes above place them.
// The order is warm forwards, then pairs of a forward and a backward,
// then backwards. Stage 0 receives no input, stage n − 1 no gradient and
// sends no output.
func megatronP2P(sch job.PPSchedule, order []job.PipeAction, n, warm int) (before, after [][]p2pEvent) {
	before = make([][]p2pEvent, len(order))
	after = make([][]p2pEvent, len(order))
	recvInput := func(a job.PipeAction) []p2pEvent {
		if a.Stage == 0 {
			return nil
		}
		return []p2pEvent{{p2pRecvInput, a}}
	}
	recvGrad := func(a job.PipeAction) []p2pEvent {
		if a.Stage == n-1 {
			return nil
		}
		return []p2pEvent{{p2pRecvGrad, a}}
	}
	freeOutput := func(a job.PipeAction) []p2pEvent {
		if a.Stage == n-1 {
			return nil
		}
		return []p2pEvent{{p2pFreeOutput, a}}
	}
	var fs, bs []int // indices of the forwards, of the backwards
	for k, a := range order {
		if a.Kind == job.PipeF {
			fs = append(fs, k)
		} else {
			bs = append(bs, k)
		}
	}
	if sch != job.PPInterleaved1F1B {
		// Blocking p2p: each tensor right before its action, a steady
		// forward's paired gradient right after it, before its output is
		// freed.
		paired := make([]bool, len(order)) // a backward whose gradient its forward's send received
		for j, k := range fs {
			before[k] = recvInput(order[k])
			if j >= warm && k+1 < len(order) {
				after[k] = recvGrad(order[k+1])
				paired[k+1] = true
			}
			after[k] = append(after[k], freeOutput(order[k])...)
		}
		for _, k := range bs {
			if !paired[k] {
				before[k] = recvGrad(order[k])
			}
		}
		return before, after
	}
	if len(fs) > 0 {
		before[fs[0]] = recvInput(order[fs[0]])
	}
	for j, k := range fs {
		if j+1 < len(fs) {
			after[k] = append(after[k], recvInput(order[fs[j+1]])...)
		}
		if j < warm {
			after[k] = append(after[k], freeOutput(order[k])...)
		}
		if j == warm-1 && warm < len(fs) && len(bs) > 0 {
			after[k] = append(after[k], recvGrad(order[bs[0]])...)
		}
	}
	if (warm == 0 || warm >= len(fs)) && len(bs) > 0 {
		before[bs[0]] = recvGrad(order[bs[0]])
	}
	for j, k := range bs {
		if j+1 < len(bs) {
			after[k] = append(after[k], recvGrad(order[bs[j+1]])...)
		}
		if f := warm + j; f < len(fs) {
			after[k] = append(after[k], freeOutput(order[fs[f]])...) // the paired steady-state forward's
		}
	}
	return before, after
}

// p2pLabels are the labels of Megatron's p2p tensors: the received input
// shares PyTorch's receive buffer's label (it is the same tensor, the
// stage's first saved input), the output PyTorch's kept output's.
const (
	labelRecvInput = "p2p_recv_activation"
	labelRecvGrad  = "p2p_recv_grad"
	labelOutput    = "p2p_stage_output"
)

// p2p emits one Megatron p2p event on the builder of its message's stage,
// in phase ph of accumulation micro-step micro.
func (s *stageBuilder) p2p(e p2pEvent, ph Phase, micro int) {
	s.phase = ph
	s.micro = micro*s.m + e.a.Micro
	switch e.kind {
	case p2pRecvInput:
		s.alloc(s.units[0].Layer, labelRecvInput, s.dx, CatActivations)
	case p2pRecvGrad:
		s.allocOn(ComputeStream, s.units[s.last].Layer, labelRecvGrad, s.dx)
	case p2pFreeOutput:
		s.free(s.units[s.last].Layer, labelOutput, s.dx, CatActivations)
	}
}

// freeRecvMegatron frees, at the end of a backward, what Megatron's p2p
// held for it: the received input and the received gradient (popped from
// input_tensors and output_tensor_grads by backward_step_helper and dropped
// when it returns).
func (s *stageBuilder) freeRecvMegatron() {
	if !s.first {
		s.free(s.units[0].Layer, labelRecvInput, s.dx, CatActivations)
	}
	if !s.lastStage {
		s.freeOn(ComputeStream, s.units[s.last].Layer, labelRecvGrad, s.dx)
	}
}
