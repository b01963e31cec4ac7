package numeric

import (
	"context"
	"errors"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// epStage runs one rank's routed experts under expert parallelism; it is
// the ref.ExpertStage of every MoE block of an EP rank.
//
// Member j of the EP group (ep ranks) owns global experts
// [j·El, (j+1)·El), El = E/ep. Dispatch: the rank's rows (already in global
// expert order, counts[e] for expert e, dropless) go to their owners — the
// rows for member j are contiguous, Σ_{e owned by j} counts[e] of them —
// after an all-to-all of the per-expert counts; the owner regroups what it
// received from member 0, 1, … by local expert, runs each expert's SwiGLU
// (y = W_down·(silu(W_gate·x) ⊙ W_up·x)) over its rows, puts the outputs
// back in arrival order and returns them by the reverse all-to-all
// (combine). Backward sends the output gradients the same way, runs the
// experts' backward, accumulates their weight gradients and returns the
// input gradients by the reverse all-to-all.
//
// ref.ExpertStage has no error result: the first collective error is kept
// in err (the stage then returns zeros of the right size) and the rank
// checks it after each block call.
type epStage struct {
	ctx   context.Context
	ep    *collective.Endpoint
	group parallel.Group
	cfg   *moe.Config
	dtype moe.DType // all-to-all payload type (activation dtype)
	rec   moe.Recorder

	// weights and grads return the gathered weights and the gradient
	// accumulators of the rank's local experts of a layer, indexed by local
	// expert: [F,D], [F,D], [D,F].
	weights func(layer int) (gate, up, down [][]float32)
	grads   func(layer int) (gate, up, down [][]float32)

	ac moe.AC
	// afterBackward reduces a layer's expert gradients once they are
	// complete, between the two all-to-alls of the experts' backward (the
	// schedule's position for it); micro is the current micro-step.
	afterBackward func(layer, micro int) error
	micro         int
	// wq, when set, receives the experts' weight-gradient GEMMs of
	// ExpertsBackward instead of running them there (the pipeline's
	// backward-input pass of zero-bubble schedules; the weight pass runs
	// them): they read only the pass's own dy, x and activations, not the
	// all-to-alls, which stay in the input pass.
	wq *ref.WeightQueue

	saved map[int]*epSaved
	// comm caches, per layer, the all-to-all results of a forward whose
	// experts will be recomputed under selective checkpointing, which saves
	// communication outputs (torchtitan's SAC list): the recompute reuses
	// them instead of exchanging again. Fully checkpointed blocks re-run
	// their all-to-alls, as torchtitan's full AC does, and so do MoE
	// layers under the modules policy's moe (Megatron's checkpoint
	// re-runs MoELayer.forward, its dispatch and combine included).
	comm map[int]*epComm
	err  error
}

// epComm is what a forward's all-to-alls produced.
type epComm struct {
	recv             []float32
	byExpert         [][]int
	sendCnt, recvCnt []int
	out              []float32
}

// bind attaches the stage to a step's context and endpoint.
func (s *epStage) bind(ctx context.Context, ep *collective.Endpoint) {
	s.ctx, s.ep, s.err = ctx, ep, nil
	s.group = ep.Comm().Mesh().Group(parallel.AxisEP, ep.Rank())
	s.saved = map[int]*epSaved{}
	s.comm = map[int]*epComm{}
}

// epSaved is what one layer's expert backward reads.
type epSaved struct {
	sendCounts []int       // rows this rank sent to each member
	recvCounts []int       // rows it received from each member
	perm       []int       // perm[i] = arrival row of the i-th expert-major row
	rowsPer    []int       // rows per local expert, expert-major
	x, g, u    [][]float32 // per local expert: inputs [M,D], gate and up outputs [M,F]
}

func (s *epStage) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// route exchanges counts and rows: it returns the rows received (grouped by
// source member, within a source by local expert), the per-source counts
// per local expert, and the send/receive row counts per member.
func (s *epStage) route(xe []float32, counts []int) (recv []float32, byExpert [][]int, send, got []int) {
	n := s.group.Size()
	E := s.cfg.Experts
	el := E / n
	D := s.cfg.Hidden
	send = make([]int, n)
	cf := make([]float32, E)
	for e, c := range counts {
		send[e/el] += c
		cf[e] = float32(c)
	}
	ce := make([]int, n)
	for j := range ce {
		ce[j] = el
	}
	rc, _, err := s.ep.AllToAll(s.ctx, s.group, moe.I64, cf, ce, 1)
	if err != nil {
		s.fail(err)
		return nil, nil, nil, nil
	}
	byExpert = make([][]int, n)
	for j := range byExpert {
		byExpert[j] = make([]int, el)
		for e := range byExpert[j] {
			byExpert[j][e] = int(rc[j*el+e])
		}
	}
	recv, got, err = s.ep.AllToAll(s.ctx, s.group, s.dtype, xe, send, D)
	if err != nil {
		s.fail(err)
		return nil, nil, nil, nil
	}
	return recv, byExpert, send, got
}

// permutation returns, for rows grouped by source then expert, the order
// that groups them by expert then source, and the rows per expert.
func permutation(byExpert [][]int, el int) (perm, rowsPer []int) {
	n := len(byExpert)
	start := make([][]int, n) // arrival offset of (source, expert)
	off := 0
	for j := 0; j < n; j++ {
		start[j] = make([]int, el)
		for e := 0; e < el; e++ {
			start[j][e] = off
			off += byExpert[j][e]
		}
	}
	rowsPer = make([]int, el)
	for e := 0; e < el; e++ {
		for j := 0; j < n; j++ {
			for r := 0; r < byExpert[j][e]; r++ {
				perm = append(perm, start[j][e]+r)
			}
			rowsPer[e] += byExpert[j][e]
		}
	}
	return perm, rowsPer
}

// DeferWeightGrads makes ExpertsBackward queue the experts'
// weight-gradient GEMMs on q (run them at once for nil); ref.Block's
// DeferWeightGrads hands its queue on to its stage through it.
func (s *epStage) DeferWeightGrads(q *ref.WeightQueue) { s.wq = q }

// ExpertsForward implements ref.ExpertStage.
func (s *epStage) ExpertsForward(layer int, xe []float32, counts []int, pass moe.Pass, keep bool) []float32 {
	D, F := s.cfg.Hidden, s.cfg.ExpertFFN
	out := make([]float32, len(xe))
	if s.err != nil {
		return out
	}
	cached := s.comm[layer]
	var recv []float32
	var byExpert [][]int
	var send, got []int
	if pass == moe.Recompute && cached != nil {
		recv, byExpert, send, got = cached.recv, cached.byExpert, cached.sendCnt, cached.recvCnt
	} else {
		recv, byExpert, send, got = s.route(xe, counts)
		if s.err != nil {
			return out
		}
	}
	el := s.cfg.Experts / s.group.Size()
	perm, rowsPer := permutation(byExpert, el)
	wg, wu, wd := s.weights(layer)
	sv := &epSaved{sendCounts: send, recvCounts: got, perm: perm, rowsPer: rowsPer,
		x: make([][]float32, el), g: make([][]float32, el), u: make([][]float32, el)}
	y := make([]float32, len(recv))
	row := 0
	var mnk, acts int64
	for e := 0; e < el; e++ {
		M := rowsPer[e]
		x := make([]float32, M*D)
		for i := 0; i < M; i++ {
			src := perm[row+i]
			copy(x[i*D:(i+1)*D], recv[src*D:(src+1)*D])
		}
		g := make([]float32, M*F)
		u := make([]float32, M*F)
		a := make([]float32, M*F)
		ye := make([]float32, M*D)
		if M > 0 {
			kernel.Sgemm(false, true, M, F, D, 1, x, D, wg[e], D, 0, g, F)
			kernel.Sgemm(false, true, M, F, D, 1, x, D, wu[e], D, 0, u, F)
			for i := range a {
				a[i] = silu(g[i]) * u[i]
			}
			kernel.Sgemm(false, true, M, D, F, 1, a, F, wd[e], F, 0, ye, D)
		}
		for i := 0; i < M; i++ {
			dst := perm[row+i]
			copy(y[dst*D:(dst+1)*D], ye[i*D:(i+1)*D])
		}
		sv.x[e], sv.g[e], sv.u[e] = x, g, u
		row += M
		mnk += int64(M) * int64(F) * int64(D)
		acts += int64(M) * int64(F)
	}
	if s.rec != nil {
		for _, op := range []moe.Op{moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertDown} {
			s.rec.RecordOp(moe.OpRecord{Layer: layer, Op: op, Pass: pass, Count: mnk})
		}
		s.rec.RecordOp(moe.OpRecord{Layer: layer, Op: moe.OpExpertAct, Pass: pass, Count: acts})
	}
	if keep {
		s.saved[layer] = sv
		if s.rec != nil {
			rows := int64(len(recv) / D)
			for _, t := range []struct {
				name moe.Saved
				n    int64
			}{{moe.SavedInput, rows * int64(D)}, {moe.SavedGate, rows * int64(F)}, {moe.SavedUp, rows * int64(F)}} {
				s.rec.RecordSaved(moe.SavedRecord{Layer: layer, Op: moe.OpExpertGate, Tensor: t.name, Elements: t.n, DType: s.dtype})
			}
		}
	}
	if pass == moe.Recompute && cached != nil {
		delete(s.comm, layer)
		return cached.out
	}
	back, _, err := s.ep.AllToAll(s.ctx, s.group, s.dtype, y, got, D)
	if err != nil {
		s.fail(err)
		return out
	}
	if pass == moe.Forward && !keep && !s.ac.FullyCheckpointed(layer) && !s.ac.MoERecomputed(s.cfg, layer) {
		s.comm[layer] = &epComm{recv: recv, byExpert: byExpert, sendCnt: send, recvCnt: got, out: back}
	}
	return back
}

// ExpertsBackward implements ref.ExpertStage.
func (s *epStage) ExpertsBackward(layer int, dye []float32) []float32 {
	D, F := s.cfg.Hidden, s.cfg.ExpertFFN
	dxe := make([]float32, len(dye))
	sv := s.saved[layer]
	delete(s.saved, layer)
	if s.err != nil {
		return dxe
	}
	if sv == nil {
		s.fail(errNoSavedExperts)
		return dxe
	}
	dy, _, err := s.ep.AllToAll(s.ctx, s.group, s.dtype, dye, sv.sendCounts, D)
	if err != nil {
		s.fail(err)
		return dxe
	}
	wg, wu, wd := s.weights(layer)
	gg, gu, gd := s.grads(layer)
	dx := make([]float32, len(dy))
	row := 0
	var mnk, acts int64
	for e, M := range sv.rowsPer {
		if M == 0 {
			continue
		}
		dyE := make([]float32, M*D)
		for i := 0; i < M; i++ {
			src := sv.perm[row+i]
			copy(dyE[i*D:(i+1)*D], dy[src*D:(src+1)*D])
		}
		g, u, x := sv.g[e], sv.u[e], sv.x[e]
		a := make([]float32, M*F)
		for i := range a {
			a[i] = silu(g[i]) * u[i]
		}
		da := make([]float32, M*F)
		kernel.Sgemm(false, false, M, F, D, 1, dyE, D, wd[e], F, 0, da, F)
		dg := make([]float32, M*F)
		du := make([]float32, M*F)
		for i := range da {
			sg := sigmoid(g[i])
			du[i] = da[i] * g[i] * sg
			dg[i] = da[i] * u[i] * sg * (1 + g[i]*(1-sg))
		}
		dxE := make([]float32, M*D)
		kernel.Sgemm(false, false, M, D, F, 1, dg, F, wg[e], D, 0, dxE, D)
		kernel.Sgemm(false, false, M, D, F, 1, du, F, wu[e], D, 1, dxE, D)
		s.wq.Do(func() {
			kernel.Sgemm(true, false, D, F, M, 1, dyE, D, a, F, 1, gd[e], F)
			kernel.Sgemm(true, false, F, D, M, 1, dg, F, x, D, 1, gg[e], D)
			kernel.Sgemm(true, false, F, D, M, 1, du, F, x, D, 1, gu[e], D)
		})
		for i := 0; i < M; i++ {
			dst := sv.perm[row+i]
			copy(dx[dst*D:(dst+1)*D], dxE[i*D:(i+1)*D])
		}
		row += M
		mnk += int64(M) * int64(F) * int64(D)
		acts += int64(M) * int64(F)
	}
	if s.rec != nil {
		for _, op := range []moe.Op{moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertDown} {
			s.rec.RecordOp(moe.OpRecord{Layer: layer, Op: op, Pass: moe.BackwardData, Count: mnk})
			s.rec.RecordOp(moe.OpRecord{Layer: layer, Op: op, Pass: moe.BackwardWeight, Count: mnk})
		}
		s.rec.RecordOp(moe.OpRecord{Layer: layer, Op: moe.OpExpertAct, Pass: moe.BackwardData, Count: acts})
	}
	if s.afterBackward != nil {
		if err := s.afterBackward(layer, s.micro); err != nil {
			s.fail(err)
			return dxe
		}
	}
	back, _, err := s.ep.AllToAll(s.ctx, s.group, s.dtype, dx, sv.recvCounts, D)
	if err != nil {
		s.fail(err)
		return dxe
	}
	return back
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

func silu(x float32) float32 { return x * sigmoid(x) }

var errNoSavedExperts = errors.New("expert backward without a kept forward of that layer")
