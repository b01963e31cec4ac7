package memory

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

// sixLayerMoE is moetest's tiny MoE with six identical MoE blocks.
func sixLayerMoE() *moe.Config {
	return moetest.TinyMoELayers(true, true, true, true, true, true)
}

func pipelineLayout(t *testing.T, l job.Layout) job.Layout {
	t.Helper()
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestPipelineMemory checks each pipeline rank's timeline against what the
// schedule implies, derived independently of the stage builder:
//   - the live saved activations never exceed, and reach, the most that
//     the rank's order holds at once, each forward of stage s adding the
//     saved bytes of s's units per micro-batch (the unpipelined report's
//     per-unit Saved at one micro-batch's shape) less the input a
//     non-first stage receives (its receive buffer) plus the output a
//     non-last stage keeps (T×D activations each, T/tp tokens under tensor
//     parallelism), each backward taking them away; under zero-bubble
//     schedules a backward-input pass takes away only the kept output (on
//     the last stage the loss's own saved tensors, which PyTorch frees when
//     it detaches the loss) and the weight pass the rest, except on stage
//     0, whose input pass does nothing and whose weight pass takes all;
//   - Setup holds m receive buffers of that size per direction per stage
//     boundary of the rank;
//   - parameters and optimizer state summed over ranks are the
//     unpipelined rank's (the same dp_shard and tp split each unit alike);
//   - the compute weights of the rank's units are live once each (FSDP's
//     gathered copies, or the other modes' compute-type casts);
//   - the report is the rank with the highest peak reserved.
func TestPipelineMemory(t *testing.T) {
	cfg := sixLayerMoE()
	for _, c := range []struct {
		l   job.Layout
		lbs int
	}{
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2}, 4},                                                         // 1F1B, split [3, 3]
		{job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPGPipe}, 3},                                            // split [1, 2, 2, 1]
		{job.Layout{GPUs: 8, PP: 4, DPShard: 2, PPSchedule: job.PPInterleaved1F1B}, 8},                      // 8 stages [0, 1, 1, 1, 1, 1, 1, 0]
		{job.Layout{GPUs: 2, PP: 2, PPLayers: "1,5", PPMicrobatchSize: 2}, 6},                               // explicit split, 3 micro-batches of 2
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "2,1,1,2"}, 2}, // m < pp·v
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardZeRO1}, 4},                               // weights cast, not gathered
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardDDP, PPSchedule: job.PPGPipe}, 2},
		// Tensor parallelism inside the stages: tp pieces, split
		// activations, sequence-parallel messages of T/tp tokens.
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2}, 4},
		{job.Layout{GPUs: 4, PP: 2, TP: 2, EP: 2, ETP: 1, PPSchedule: job.PPInterleaved1F1B}, 4}, // ep borrowing the tp ranks
		{job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPZBVZeroBubble}, 4},
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPZBVZeroBubble}, 4},                  // V: stages (0, 3), (1, 2)
		{job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPZBVZeroBubble, PPLayers: "0,1,1,1,1,1,1,0"}, 3}, // m < 2·pp − 1
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPInterleavedZeroBubble}, 4},
		{job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleavedZeroBubble, Sharding: job.ShardZeRO1}, 2},
		{job.Layout{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPDualPipeV}, 4}, // B, I and W on one stage
		{job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPDualPipeV, PPLayers: "0,1,1,1,1,1,1,0"}, 9},
	} {
		cfg := cfg
		if c.l.TP > 1 {
			tc := *cfg
			tc.KVHeads = 2 // tp 2 must divide the KV heads
			cfg = &tc
		}
		l := pipelineLayout(t, c.l)
		name := fmt.Sprintf("pp%d/%s/v%d/lbs%d/%s/%s/tp%d", l.PP, l.PPSchedule, l.PPVirtualStages, c.lbs, l.PPLayers, l.Sharding, l.TP)
		o := Options{AC: moe.AC{Mode: moe.ACSelective}}
		b := Batch{LBS: c.lbs, Seq: 8, GradAccum: 2}
		rep, err := Estimate(cfg, l, b, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		flat := l
		flat.PP, flat.PPSchedule, flat.PPMicrobatchSize, flat.PPVirtualStages, flat.PPLayers = 0, "", 0, 0, ""
		flat.GPUs = l.StageGPUs()
		one, err := Estimate(cfg, flat, Batch{LBS: l.PPMicrobatchSize, Seq: 8, GradAccum: 1}, o)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := l.Microbatches(c.lbs)
		split, _ := l.StageSplit(cfg.Layers)
		order, _ := job.PipelineOrder(l.PPSchedule, l.PP, l.PPVirtualStages, m)
		// A message and a receive buffer: the tp rank's T/tp tokens.
		dx := int64(l.PPMicrobatchSize) * 8 / int64(l.TPDegree()) * int64(cfg.Hidden) * moe.DefaultPrecision.Activation.Bytes()
		n := l.PipelineStages()
		// Per-micro-batch saved bytes of each stage, from the unpipelined
		// per-unit table: units are embed, blocks 0…L−1, head.
		perMB := make([]int64, n)
		at := 1
		for s := range n {
			if s == 0 {
				perMB[s] += one.Saved[0]
			} else {
				perMB[s] -= dx
			}
			for range split[s] {
				perMB[s] += one.Saved[at]
				at++
			}
			if s == n-1 {
				perMB[s] += one.Saved[len(one.Saved)-1]
			} else {
				perMB[s] += dx
			}
		}
		// The loss's own saved tensors, from the head's per-op table at one
		// micro-batch's shape: the setup's, whose tensor-parallel fields
		// (the tp rank's share of the vocabulary's log-probabilities) must
		// be the layout's.
		no, err := o.normalized()
		if err != nil {
			t.Fatal(err)
		}
		ps, err := newPipelineSetup(cfg, l, b, no)
		if err != nil {
			t.Fatal(err)
		}
		if sh := ps.sh; sh.Batch != l.PPMicrobatchSize || sh.TP != l.TPDegree() || sh.ExpertTP != l.ExpertTP() || sh.ExpertRows != l.TokensPerExpertRank() {
			t.Errorf("%s: setup's shape %+v, want batch %d, tp %d, expert tp %d, expert rows %d", name, sh, l.PPMicrobatchSize, l.TPDegree(), l.ExpertTP(), l.TokensPerExpertRank())
		}
		headSaved, err := Saved(cfg, cfg.LayerHead(), ps.sh)
		if err != nil {
			t.Fatal(err)
		}
		var lossSaved int64
		for _, r := range headSaved {
			if r.Op == moe.OpLoss {
				lossSaved += r.Bytes()
			}
		}
		var params, opt int64
		var worst int64
		for r := range l.PP {
			var want, live int64
			wantAt := []int64{0} // live after each action
			for _, a := range order[r] {
				// A zero-bubble input pass on a stage other than the first
				// frees only the kept output; its weight pass the rest.
				// On the last stage that is the loss's own saved tensors.
				kept := dx
				if a.Stage == n-1 {
					kept = lossSaved
				}
				switch {
				case a.Kind == job.PipeF:
					live += perMB[a.Stage]
				case a.Kind == job.PipeB:
					live -= perMB[a.Stage]
				case a.Stage == 0:
					if a.Kind == job.PipeW {
						live -= perMB[a.Stage]
					}
				case a.Kind == job.PipeI:
					live -= kept
				default:
					live -= perMB[a.Stage] - kept
				}
				want = max(want, live)
				wantAt = append(wantAt, live)
			}
			// The timeline of each prefix of the order, one micro-step,
			// leaves live the saved activations the per-action sums say.
			// This sees what each pass frees: the most alone does not see
			// a zero-bubble input pass free the loss's tensors, which the
			// stage's weight pass follows at once.
			for k := 1; k <= len(order[r]); k++ {
				pk := ps
				pk.order = slices.Clone(ps.order)
				pk.order[r] = order[r][:k]
				rk, err := pk.timeline(cfg, l, 1, no, r, nil)
				if err != nil {
					t.Fatalf("%s rank %d, first %d actions: %v", name, r, k, err)
				}
				var left int64
				for _, e := range rk.Events {
					if e.Category == CatActivations {
						left += e.Delta()
					}
				}
				if left != wantAt[k] {
					t.Errorf("%s rank %d: %d B of saved activations live after %v (action %d), want %d", name, r, left, order[r][k-1], k, wantAt[k])
				}
			}
			rr, err := pipelineRankReport(cfg, l, b, o, r)
			if err != nil {
				t.Fatal(err)
			}
			// The compute weights of the rank's units are live once each,
			// the whole step: never more.
			var weights, liveW, maxW int64
			for _, u := range rr.Units {
				weights += u.Local * moe.DefaultPrecision.Compute.Bytes()
			}
			var got, cur, setupComm int64
			for _, e := range rr.Events {
				if e.Category == CatWeights {
					liveW += e.Delta()
					maxW = max(maxW, liveW)
				}
				if e.Phase == Setup && e.Category == CatComm {
					setupComm += e.Bytes
				}
				if e.Category != CatActivations {
					continue
				}
				cur += e.Delta()
				got = max(got, cur)
			}
			if got != want {
				t.Errorf("%s rank %d: most live saved activations %d B, want %d", name, r, got, want)
			}
			if maxW != weights {
				t.Errorf("%s rank %d: at most %d B of compute weights live, want the units' %d", name, r, maxW, weights)
			}
			boundaries := int64(0)
			for _, s := range l.RankStages(r) {
				if s > 0 {
					boundaries++
				}
				if s < n-1 {
					boundaries++
				}
			}
			if setupComm != int64(m)*dx*boundaries {
				t.Errorf("%s rank %d: setup receive buffers %d B, want %d micro-batches × %d B × %d", name, r, setupComm, m, dx, boundaries)
			}
			params += rr.State.Params
			opt += rr.State.Optimizer
			if rep.Stages[r].PeakReservedBytes != rr.Peak.Reserved {
				t.Errorf("%s rank %d: Stages says %d B reserved, the rank's replay %d", name, r, rep.Stages[r].PeakReservedBytes, rr.Peak.Reserved)
			}
			if rr.Peak.Reserved > worst {
				worst = rr.Peak.Reserved
			}
			if rep.Stages[r].InFlight != job.InFlight(order[r]) {
				t.Errorf("%s rank %d: in flight %d, want %d", name, r, rep.Stages[r].InFlight, job.InFlight(order[r]))
			}
		}
		if params != one.State.Params || opt != one.State.Optimizer {
			t.Errorf("%s: parameters %d + optimizer %d B over the ranks, want the unpipelined %d + %d", name, params, opt, one.State.Params, one.State.Optimizer)
		}
		if rep.Peak.Reserved != worst || rep.Stages[rep.Stage].PeakReservedBytes != worst {
			t.Errorf("%s: report is rank %d with %d B reserved, want the worst %d", name, rep.Stage, rep.Peak.Reserved, worst)
		}
	}
}

// pipelineRankReport rebuilds rank r's report alone.
func pipelineRankReport(cfg *moe.Config, l job.Layout, b Batch, o Options, r int) (Report, error) {
	o, err := o.normalized()
	if err != nil {
		return Report{}, err
	}
	ps, err := newPipelineSetup(cfg, l, b, o)
	if err != nil {
		return Report{}, err
	}
	return ps.rank(cfg, l, b.GradAccum, o, r, nil)
}

func TestPipelineMemoryErrors(t *testing.T) {
	cfg := sixLayerMoE()
	for _, c := range []struct {
		l    job.Layout
		lbs  int
		want string
	}{
		{job.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 2}, 3, "lbs = 3 is not a multiple of pp_microbatch_size = 2"},
		{job.Layout{GPUs: 4, PP: 2, DPReplicate: 2, AllreduceLastOnly: true}, 2, "allreduce_last_only with pp > 1 is not modelled"},
		{job.Layout{GPUs: 9, PP: 9}, 9, "torchtitan's split needs at least one effective layer per stage"},
		{job.Layout{GPUs: 2, PP: 2, PPLayers: "2,2"}, 2, "must sum to the model's 6 layers"},
	} {
		l := pipelineLayout(t, c.l)
		_, err := Estimate(cfg, l, Batch{LBS: c.lbs, Seq: 8, GradAccum: 1}, Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v lbs %d: %v, want %q", c.l, c.lbs, err, c.want)
		}
	}
}

// TestPipelineMaxLBS: where not every lbs is a pipeline batch, MaxLBS
// searches only those the schedule runs. The valid lbs are derived by hand
// (PyTorch's schedules via job.Layout.Microbatches' rules): micro-batches
// of 2 take even lbs; Interleaved1F1B and InterleavedZeroBubble at pp 2
// take m micro-batches with m a multiple of max(1, m ÷ 2), so 1, 2, 3, 4,
// then the even ones; DualPipeV at pp 2 needs m ≥ 2·pp = 4. The oracle is
// a linear scan over those, with device sizes on and one byte either side
// of a valid lbs's peak.
func TestPipelineMaxLBS(t *testing.T) {
	cfg := sixLayerMoE()
	// Segments of one rounded block each, so that the tiny model's peak
	// reserved grows with every micro-batch (PyTorch's 2 MiB segments
	// would hold all of them).
	o := Options{Allocator: &Allocator{RoundBytes: 512, SmallBytes: 512, SmallSegmentBytes: 512, LargeSegmentBytes: 512,
		MinLargeAllocBytes: 512, RoundLargeBytes: 512}}
	interleaved := []int{1, 2, 3, 4, 6, 8, 10, 12}
	for _, c := range []struct {
		l     job.Layout
		valid []int // the valid lbs up to 12, by hand
	}{
		{job.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 2}, []int{2, 4, 6, 8, 10, 12}},
		{job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleaved1F1B}, interleaved},
		{job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleavedZeroBubble}, interleaved},
		{job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPDualPipeV}, []int{4, 5, 6, 7, 8, 9, 10, 11, 12}},
	} {
		l := pipelineLayout(t, c.l)
		reserved := map[int]int64{}
		var valid []int
		for n := 1; n <= 12; n++ {
			if r, err := Estimate(cfg, l, Batch{LBS: n, Seq: 8}, o); err == nil {
				reserved[n] = r.Peak.Reserved
				valid = append(valid, n)
			}
		}
		if !slices.Equal(valid, c.valid) {
			t.Fatalf("%s mbs %d: Estimate runs lbs %v of 1…12, want %v", l.PPSchedule, l.PPMicrobatchSize, valid, c.valid)
		}
		// Boundaries at valid lbs whose next valid lbs needs more than a
		// byte more (the allocator's rounding makes some peaks equal).
		var ks []int
		for i, k := range valid[:len(valid)-1] {
			if reserved[valid[i+1]] > reserved[k]+1 {
				ks = append(ks, k)
			}
		}
		if len(ks) == 0 {
			t.Fatalf("%s: no two valid lbs up to 12 differ in peak", l.PPSchedule)
		}
		for _, k := range ks {
			for _, delta := range []int64{-1, 0, 1} {
				device := reserved[k] + delta // target 1: the limit is the device
				want := 0
				for _, n := range valid {
					if reserved[n] > device {
						break
					}
					want = n
				}
				got, r, err := MaxLBS(cfg, l, 8, 1, o, device, 1)
				if err != nil || got != want {
					t.Errorf("%s mbs %d, device %d (lbs %d %+d B): max lbs %d, %v; linear scan %d", l.PPSchedule, l.PPMicrobatchSize, device, k, delta, got, err, want)
				}
				if got > 0 && r.Peak.Reserved != reserved[got] {
					t.Errorf("%s device %d: report is not lbs %d's", l.PPSchedule, device, got)
				}
			}
		}
	}
}
