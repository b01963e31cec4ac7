package job

import "fmt"

// The per-rank orders of a pipeline step, one per schedule, follow PyTorch's
// torch.distributed.pipelining schedules at the commit pipeline.go cites.

// PipeKind is what a pipeline compute action runs (PyTorch's
// _ComputationType F, B, I, W).
type PipeKind uint8

// Pipeline compute actions.
const (
	PipeF PipeKind = iota // forward
	PipeB                 // full backward: input and weight gradients
	PipeI                 // backward input: the gradient sent upstream
	PipeW                 // backward weight: the weight gradients, after its I
)

func (k PipeKind) String() string { return [...]string{"F", "B", "I", "W"}[k] }

// PipeAction is one compute action of a pipeline rank: a forward or a
// backward pass of micro-batch Micro through stage Stage.
type PipeAction struct {
	Kind  PipeKind
	Stage int // 0 ≤ Stage < pp × virtual stages; on rank Layout.StageRank(Stage)
	Micro int // 0 ≤ Micro < micro-batches
}

// Frees reports whether the action ends the micro-batch's use of the
// stage's activations: a full backward or a weight pass (after a
// backward-input pass the activations the weight pass reads stay).
func (a PipeAction) Frees() bool { return a.Kind == PipeB || a.Kind == PipeW }

func (a PipeAction) String() string {
	return fmt.Sprintf("%d%s%d", a.Stage, a.Kind, a.Micro) // PyTorch's _Action notation
}

// PipelineOrder returns, for each of the pp ranks, the compute actions it
// issues in order under schedule s with v stages per rank and m
// micro-batches (PyTorch's schedules without their idle slots: a rank
// runs its next action as soon as its inputs have arrived):
//   - GPipe: forwards of micro-batches 0…m−1, then their backwards in the
//     same order;
//   - 1F1B: rank r runs min(m, pp − r) forwards, then alternates one
//     backward and one forward, then the remaining backwards;
//   - Interleaved1F1B: rank r's stages r, r + pp, …; with rounds =
//     max(1, m ÷ pp) and k = m ÷ rounds micro-batches per round, warm-up
//     w = min((v − 1)·k + 2·(pp − 1 − r), v·m) forwards, then v·m − w
//     (forward, backward) pairs, then w backwards; the j-th forward goes
//     to local stage ⌊j ÷ k⌋ mod v and the j-th backward to local stage
//     v − 1 − ⌊j ÷ k⌋ mod v, each stage taking its micro-batches in order;
//   - InterleavedZeroBubble: the same stages and rounds with warm-up
//     w = min((v − 1)·k + (pp − 1 − r), v·m); its backwards are input
//     passes, and from the (r + 1)-th backward on each is followed by the
//     weight pass of the oldest input pass still waiting; the weight
//     passes left run at the end;
//   - ZBVZeroBubble: rank r holds stages r (chunk 0) and 2·pp − 1 − r
//     (chunk 1) and follows PyTorch's _calculate_single_rank_operations
//     over n = max(2·pp − 1, m) micro-batches, dropping those ≥ m (see
//     zbvOrder);
//   - DualPipeV: the same placement, PyTorch's ScheduleDualPipeV for
//     m ≥ 2·pp (see dualPipeVOrder); its overlapped forward-backward pairs
//     are issued as their two actions, forward first, which is how
//     PyTorch's runtime runs an OVERLAP_F_B without a registered overlap
//     function (torchtitan registers none).
func PipelineOrder(s PPSchedule, pp, v, m int) ([][]PipeAction, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	if pp < 1 || pp > MaxDegree || m < 1 || m > 1<<20 || v < 1 || int64(pp)*int64(v) > MaxDegree {
		return nil, fmt.Errorf("pipeline order: pp = %d, virtual stages = %d, micro-batches = %d: need pp, v ≥ 1, pp·v ≤ %d and m in [1, %d]", pp, v, m, MaxDegree, 1<<20)
	}
	if s.MultiStage() && v < 2 || !s.MultiStage() && v != 1 {
		return nil, fmt.Errorf("pipeline order: %s with %d stages per rank (single-stage schedules take 1, multi-stage ones at least 2)", s, v)
	}
	if s.VShaped() && v != 2 {
		return nil, fmt.Errorf("pipeline order: %s with %d stages per rank (V-shaped schedules take exactly 2)", s, v)
	}
	order := make([][]PipeAction, pp)
	for r := range order {
		switch s {
		case PPGPipe:
			order[r] = gpipeOrder(r, m)
		case PP1F1B:
			order[r] = oneFOneBOrder(r, pp, m)
		case PPInterleaved1F1B, PPInterleavedZeroBubble:
			rounds := max(1, m/pp)
			if m%rounds != 0 {
				return nil, fmt.Errorf("pipeline order: %s with %d micro-batches: need a multiple of its rounds max(1, m ÷ pp) = %d", s, m, rounds)
			}
			order[r] = interleavedOrder(r, pp, v, m, m/rounds, s == PPInterleavedZeroBubble)
		case PPZBVZeroBubble:
			order[r] = zbvOrder(r, pp, m)
		case PPDualPipeV:
			if m < 2*pp {
				return nil, fmt.Errorf("pipeline order: %s with %d micro-batches: needs at least as many as stages, 2·pp = %d", s, m, 2*pp)
			}
			order[r] = dualPipeVOrder(r, pp, m)
		}
	}
	return order, nil
}

func gpipeOrder(r, m int) []PipeAction {
	out := make([]PipeAction, 0, 2*m)
	for i := range m {
		out = append(out, PipeAction{Stage: r, Micro: i})
	}
	for i := range m {
		out = append(out, PipeAction{Kind: PipeB, Stage: r, Micro: i})
	}
	return out
}

func oneFOneBOrder(r, pp, m int) []PipeAction {
	out := make([]PipeAction, 0, 2*m)
	f, b := 0, 0
	for ; f < min(m, pp-r); f++ {
		out = append(out, PipeAction{Stage: r, Micro: f})
	}
	for b < m {
		out = append(out, PipeAction{Kind: PipeB, Stage: r, Micro: b})
		b++
		if f < m {
			out = append(out, PipeAction{Stage: r, Micro: f})
			f++
		}
	}
	return out
}

// interleavedOrder is Interleaved1F1B's order, or with zb
// InterleavedZeroBubble's (PipelineOrder).
func interleavedOrder(r, pp, v, m, perRound int, zb bool) []PipeAction {
	total := v * m
	hops := 2 * (pp - 1 - r) // _get_warmup_ops' multiply_factor: 2, or 1 for zero bubble
	if zb {
		hops = pp - 1 - r
	}
	warm := min((v-1)*perRound+hops, total)
	nextF := make([]int, v) // next micro-batch per local stage
	nextB := make([]int, v)
	fwd := func(j int) PipeAction {
		local := (j / perRound) % v
		a := PipeAction{Stage: local*pp + r, Micro: nextF[local]}
		nextF[local]++
		return a
	}
	kind := PipeB
	if zb {
		kind = PipeI
	}
	var waiting []PipeAction // input passes whose weight pass has not run, oldest first
	bwd := func(j int) PipeAction {
		local := v - 1 - (j/perRound)%v
		a := PipeAction{Kind: kind, Stage: local*pp + r, Micro: nextB[local]}
		nextB[local]++
		if zb {
			waiting = append(waiting, PipeAction{Kind: PipeW, Stage: a.Stage, Micro: a.Micro})
		}
		return a
	}
	out := make([]PipeAction, 0, 3*total)
	// weight appends the oldest waiting weight pass after the j-th backward
	// once r backwards have run without one (num_1f1b_microbatches = r).
	weight := func(j int) {
		if zb && j >= r {
			out = append(out, waiting[0])
			waiting = waiting[1:]
		}
	}
	for j := range warm {
		out = append(out, fwd(j))
	}
	for j := range total - warm {
		out = append(out, fwd(warm+j), bwd(j))
		weight(j)
	}
	for j := total - warm; j < total; j++ {
		out = append(out, bwd(j))
		weight(j)
	}
	if zb {
		out = append(out, waiting...)
	}
	return out
}

// zbvOrder is rank r's ZBVZeroBubble order, PyTorch's
// _calculate_single_rank_operations over n = max(2·pp − 1, m)
// micro-batches, chunk 0 = stage r, chunk 1 = stage 2·pp − 1 − r:
//   - warm-up: 2·(pp − r) − 1 forwards of chunk 0; r pairs (chunk-1
//     forward, chunk-0 forward); pp − r triples (chunk-1 forward, input
//     pass and weight pass of chunk 1);
//   - steady state, while chunk 1 has run fewer forwards than chunk 0 or
//     chunk 0 fewer than n: a chunk-0 forward (while chunk 0 has run
//     fewer than n), chunk 0's next input and weight passes, a chunk-1
//     forward, chunk 1's next input and weight passes;
//   - cool-down: r pairs (chunk-0 input pass, chunk-1 input pass); pp − r
//     pairs (chunk-0 input pass, chunk-0's oldest waiting weight pass);
//     then chunk 1's waiting weight passes, then chunk 0's.
//
// Actions of micro-batches ≥ m are dropped, as PyTorch drops them.
func zbvOrder(r, pp, m int) []PipeAction {
	n := max(2*pp-1, m)
	c0, c1 := r, 2*pp-1-r
	var f0, f1, b0, b1 int
	var out []PipeAction
	add := func(k PipeKind, s, mb int) {
		if mb < m {
			out = append(out, PipeAction{Kind: k, Stage: s, Micro: mb})
		}
	}
	// next appends the action of kind k for stage s's micro-batch *i and
	// advances *i; iw appends an input pass and its weight pass.
	next := func(k PipeKind, s int, i *int) { add(k, s, *i); *i++ }
	iw := func(s int, b *int) { add(PipeI, s, *b); next(PipeW, s, b) }
	for range 2*(pp-r) - 1 {
		next(PipeF, c0, &f0)
	}
	for range r {
		next(PipeF, c1, &f1)
		next(PipeF, c0, &f0)
	}
	for range pp - r {
		next(PipeF, c1, &f1)
		iw(c1, &b1)
	}
	for f1 < f0 || f0 < n {
		if f0 < n {
			next(PipeF, c0, &f0)
		}
		iw(c0, &b0)
		next(PipeF, c1, &f1)
		iw(c1, &b1)
	}
	w0, w1 := b0, b1
	for range r {
		next(PipeI, c0, &b0)
		next(PipeI, c1, &b1)
	}
	for range pp - r {
		next(PipeI, c0, &b0)
		next(PipeW, c0, &w0)
	}
	for w1 < b1 {
		next(PipeW, c1, &w1)
	}
	for w0 < b0 {
		next(PipeW, c0, &w0)
	}
	return out
}

// dualPipeVOrder is rank r's DualPipeV order, PyTorch's
// ScheduleDualPipeV._calculate_single_rank_operations with chunk 0 =
// stage r, chunk 1 = stage 2·pp − 1 − r. Each stage takes its forwards and
// its backwards (full or input passes) in micro-batch order; an input
// pass queues its weight pass, and "W" below runs the oldest queued one
// (nothing when none waits); "(F c, B d)" is an overlapped pair, c's next
// forward then d's next full backward:
//  1. 2·(pp − r − 1) forwards of chunk 0;
//  2. r + 1 times: F chunk 0, F chunk 1;
//  3. pp − r − 1 times: I chunk 1, W, F chunk 1;
//  4. m − 2·pp + r + 1 times: (F 0, B 1) — on the last rank the first one
//     unpaired, F 0 then B 1 — then (F 1, B 0);
//  5. pp − r − 1 times: B chunk 1, (F 1, B 0);
//  6. r + 1 times: a backward of chunk 1, then one of chunk 0, full until
//     the switch to input passes at i = ⌊(r + 1)/2⌋ (before chunk 1's on odd
//     ranks, between the two on even ones);
//  7. pp − r − 1 times: W, then a backward of chunk 0 (an input pass once
//     switched);
//  8. r + 1 times: W.
func dualPipeVOrder(r, pp, m int) []PipeAction {
	c0, c1 := r, 2*pp-1-r
	next := map[[2]int]int{} // (stage, 0 forward / 1 backward) → next micro-batch
	var waiting []PipeAction
	var out []PipeAction
	add := func(k PipeKind, s int) {
		key := [2]int{s, 1}
		if k == PipeF {
			key[1] = 0
		}
		mb := next[key]
		next[key]++
		out = append(out, PipeAction{Kind: k, Stage: s, Micro: mb})
		if k == PipeI {
			waiting = append(waiting, PipeAction{Kind: PipeW, Stage: s, Micro: mb})
		}
	}
	weight := func() {
		if len(waiting) > 0 {
			out = append(out, waiting[0])
			waiting = waiting[1:]
		}
	}
	for range 2 * (pp - r - 1) {
		add(PipeF, c0)
	}
	for range r + 1 {
		add(PipeF, c0)
		add(PipeF, c1)
	}
	for range pp - r - 1 {
		add(PipeI, c1)
		weight()
		add(PipeF, c1)
	}
	for range m - 2*pp + r + 1 {
		add(PipeF, c0) // the pair (F 0, B 1), or unpaired on the last rank's first
		add(PipeB, c1)
		add(PipeF, c1)
		add(PipeB, c0)
	}
	for range pp - r - 1 {
		add(PipeB, c1)
		add(PipeF, c1)
		add(PipeB, c0)
	}
	zb := false
	kind := func() PipeKind {
		if zb {
			return PipeI
		}
		return PipeB
	}
	for i := range r + 1 {
		if i == (r+1)/2 && r%2 == 1 {
			zb = true
		}
		add(kind(), c1)
		if i == (r+1)/2 && r%2 == 0 {
			zb = true
		}
		add(kind(), c0)
	}
	for range pp - r - 1 {
		weight()
		add(kind(), c0)
	}
	for range r + 1 {
		weight()
	}
	return out
}

// InFlight is the most micro-batch activations a rank holds at once under
// its order: the largest count, over prefixes of actions, of forwards whose
// full backward or weight pass has not yet run (stage chunks counted
// separately, so under an interleaved schedule one micro-batch in two
// local stages counts twice; a backward-input pass keeps what its weight
// pass reads).
func InFlight(actions []PipeAction) int {
	n, most := 0, 0
	for _, a := range actions {
		switch {
		case a.Kind == PipeF:
			n++
		case a.Frees():
			n--
		}
		most = max(most, n)
	}
	return most
}

// StageLayout is the layout of one pipeline stage's ranks: the same
// data-parallel, tensor-parallel and expert degrees over StageGPUs() GPUs,
// without the pipeline. Every stage's ranks form such a mesh (pp is the
// outermost axis: stage p's ranks are p·StageGPUs() … (p+1)·StageGPUs() −
// 1, tp innermost within them), as torchtitan builds one mesh of
// pp × dp_replicate × dp_shard × cp × tp and applies tensor parallelism to
// each stage's model chunk after the pipeline split (v0.2.2, 73a0e69:
// torchtitan/distributed/pipeline_parallel.py pipeline_llm runs
// parallelize_fn on every model part).
func (l Layout) StageLayout() Layout {
	s := l
	s.GPUs = l.StageGPUs()
	s.PP, s.PPSchedule, s.PPMicrobatchSize, s.PPVirtualStages, s.PPLayers, s.PPImpl = 0, "", 0, 0, "", ""
	return s
}

// StageGPUs is the number of ranks of one pipeline stage, dp_replicate ×
// dp_shard × cp × tp.
func (l Layout) StageGPUs() int { return l.DP() * l.CPDegree() * l.TPDegree() }
