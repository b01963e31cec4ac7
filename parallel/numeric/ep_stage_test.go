package numeric

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// TestEPStageDefersExpertWeightGrads: given a ref.WeightQueue (the
// pipeline's backward-input pass of zero-bubble schedules), the
// expert-parallel stage's backward returns the same input gradient, runs
// both all-to-alls, and leaves the experts' weight gradients untouched
// until the queue runs; running it then gives, bit for bit, the gradients
// of a backward without the queue (the same GEMMs on the same operands,
// later). Two EP ranks, tiny's 4 experts of width 6 over hidden 8, uneven
// routed rows including an expert with none.
func TestEPStageDefersExpertWeightGrads(t *testing.T) {
	cfg := moetest.TinyMoE()
	l := job.Layout{GPUs: 2, EP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	mesh, err := parallel.NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	D, F, el := cfg.Hidden, cfg.ExpertFFN, cfg.Experts/l.EP
	rng := rand.New(rand.NewPCG(3, 5))
	fill := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(rng.NormFloat64())
		}
		return out
	}
	counts := [2][]int{{2, 1, 0, 3}, {1, 2, 2, 0}} // rows per global expert on each rank
	var w [2][3][][]float32                        // per rank: gate, up, down per local expert
	var xe, dy [2][]float32
	for r := range 2 {
		for e := 0; e < el; e++ {
			w[r][0] = append(w[r][0], fill(F*D))
			w[r][1] = append(w[r][1], fill(F*D))
			w[r][2] = append(w[r][2], fill(D*F))
		}
		rows := 0
		for _, c := range counts[r] {
			rows += c
		}
		xe[r], dy[r] = fill(rows*D), fill(rows*D)
	}
	type result struct {
		dx      []float32
		grads   [3][][]float32
		queued  int
		touched bool // a weight gradient was nonzero before the queue ran
	}
	run := func(deferred bool) [2]result {
		var res [2]result
		err := collective.New(mesh).Run(context.Background(), func(ctx context.Context, ep *collective.Endpoint) error {
			r := ep.Rank()
			g := &res[r].grads
			for k := range g {
				for e := 0; e < el; e++ {
					g[k] = append(g[k], make([]float32, len(w[r][k][e])))
				}
			}
			st := &epStage{cfg: cfg, dtype: moe.F32, ac: moe.AC{Mode: moe.ACNone},
				weights: func(int) (a, b, c [][]float32) { return w[r][0], w[r][1], w[r][2] },
				grads:   func(int) (a, b, c [][]float32) { return g[0], g[1], g[2] }}
			st.bind(ctx, ep)
			st.ExpertsForward(0, xe[r], counts[r], moe.Forward, true)
			var q ref.WeightQueue
			if deferred {
				st.DeferWeightGrads(&q)
			}
			res[r].dx = st.ExpertsBackward(0, dy[r])
			res[r].queued = q.Len()
			for _, ts := range g {
				for _, t := range ts {
					res[r].touched = res[r].touched || slices.ContainsFunc(t, func(v float32) bool { return v != 0 })
				}
			}
			q.Run()
			return st.err
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	now, later := run(false), run(true)
	for r := range 2 {
		if !now[r].touched {
			t.Fatalf("rank %d: the backward without a queue computed no weight gradient", r)
		}
		if later[r].touched || later[r].queued == 0 {
			t.Errorf("rank %d: with a queue, %d GEMM groups queued and weight gradients touched = %v before the queue ran; want some queued, none touched", r, later[r].queued, later[r].touched)
		}
		if !slices.Equal(now[r].dx, later[r].dx) {
			t.Errorf("rank %d: input gradient differs with the queue", r)
		}
		for k := range now[r].grads {
			for e := range now[r].grads[k] {
				if !slices.Equal(now[r].grads[k][e], later[r].grads[k][e]) {
					t.Errorf("rank %d: projection %d expert %d: queued weight gradient differs from the immediate one", r, k, e)
				}
			}
		}
	}
}
