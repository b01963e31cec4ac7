package collective

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
)

func testComm(t testing.TB, gpus, rep, gpn int) *Comm {
	t.Helper()
	l := job.Layout{GPUs: gpus, DPReplicate: rep, EP: 1, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	m, err := parallel.NewMesh(l, nil, gpn)
	if err != nil {
		t.Fatal(err)
	}
	return New(m)
}

func TestCollectiveResults(t *testing.T) {
	c := testComm(t, 4, 1, 8)
	err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
		r := ep.Rank()
		g := c.Mesh().Group(parallel.AxisShard, r)
		// all-gather: rank r contributes [r, 10r].
		got, err := ep.AllGather(ctx, g, moe.F32, []float32{float32(r), float32(10 * r)})
		if err != nil {
			return err
		}
		if want := []float32{0, 0, 1, 10, 2, 20, 3, 30}; !reflect.DeepEqual(got, want) {
			t.Errorf("rank %d all-gather %v, want %v", r, got, want)
		}
		// reduce-scatter: rank r gives in[k] = k + r over 8 elements; chunk i
		// (2 elements) sums to Σ_r (k + r) = 4k + 6.
		in := make([]float32, 8)
		for k := range in {
			in[k] = float32(k + r)
		}
		out := make([]float32, 2)
		if err := ep.ReduceScatter(ctx, g, moe.F32, in, out); err != nil {
			return err
		}
		if want := []float32{float32(4*(2*r) + 6), float32(4*(2*r+1) + 6)}; !reflect.DeepEqual(out, want) {
			t.Errorf("rank %d reduce-scatter %v, want %v", r, out, want)
		}
		// ReduceScatterAdd onto out adds the same again.
		if err := ep.ReduceScatterAdd(ctx, g, moe.F32, in, out); err != nil {
			return err
		}
		if want := float32(2 * (4*(2*r) + 6)); out[0] != want {
			t.Errorf("rank %d reduce-scatter-add %v, want %v", r, out[0], want)
		}
		// all-reduce-add: 1 + 0 + 1 + 2 + 3 = 7; in unchanged.
		acc, x := []float32{1}, []float32{float32(r)}
		if err := ep.AllReduceAdd(ctx, g, moe.F32, x, acc); err != nil {
			return err
		}
		if acc[0] != 7 || x[0] != float32(r) {
			t.Errorf("rank %d all-reduce-add: acc %v in %v, want 7 and %d", r, acc[0], x[0], r)
		}
		// broadcast from member 2.
		buf := []float32{float32(r), float32(r)}
		if err := ep.Broadcast(ctx, g, moe.F32, 2, buf); err != nil {
			return err
		}
		if buf[0] != 2 || buf[1] != 2 {
			t.Errorf("rank %d broadcast %v, want [2 2]", r, buf)
		}
		// all-to-all: rank r sends j+1 rows to member j, each row [r, j].
		var send []float32
		counts := make([]int, 4)
		for j := 0; j < 4; j++ {
			counts[j] = j + 1
			for k := 0; k <= j; k++ {
				send = append(send, float32(r), float32(j))
			}
		}
		recv, rc, err := ep.AllToAll(ctx, g, moe.F32, send, counts, 2)
		if err != nil {
			return err
		}
		var want []float32
		for j := 0; j < 4; j++ {
			if rc[j] != r+1 {
				t.Errorf("rank %d received %d rows from %d, want %d", r, rc[j], j, r+1)
			}
			for k := 0; k <= r; k++ {
				want = append(want, float32(j), float32(r))
			}
		}
		if !reflect.DeepEqual(recv, want) {
			t.Errorf("rank %d all-to-all %v, want %v", r, recv, want)
		}
		return ep.Barrier(ctx, g)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCollectiveBytes(t *testing.T) {
	// 8 ranks, 4 GPUs per node: nodes {0..3}, {4..7}.
	c := testComm(t, 8, 1, 4)
	err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
		r := ep.Rank()
		g := c.Mesh().Group(parallel.AxisShard, r)
		if _, err := ep.AllGather(ctx, g, moe.BF16, make([]float32, 3)); err != nil {
			return err
		}
		if err := ep.AllReduce(ctx, g, moe.F32, make([]float32, 16)); err != nil {
			return err
		}
		// broadcast of 10 f32 from member 5.
		if err := ep.Broadcast(ctx, g, moe.F32, 5, make([]float32, 10)); err != nil {
			return err
		}
		// all-to-all: rank r sends (r + j) mod 3 rows of width 5 to rank j.
		counts := make([]int, 8)
		total := 0
		for j := range counts {
			counts[j] = (r + j) % 3
			total += counts[j]
		}
		_, _, err := ep.AllToAll(ctx, g, moe.BF16, make([]float32, total*5), counts, 5)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 8; r++ {
		st := c.Stats.Rank(r)
		// Ring all-gather: S = 8 members × 3 elements × 2 B = 48; each rank
		// sends (n−1)/n·S = 42 B to its successor. Ranks 3 and 7 send across nodes.
		ag := st[parallel.CollAllGather]
		wantInter := int64(0)
		if r == 3 || r == 7 {
			wantInter = 42
		}
		if ag.Sent() != 42 || ag.Recv() != 42 || ag.SentInter != wantInter {
			t.Errorf("rank %d all-gather %+v, want 42 sent (%d inter) and 42 received", r, ag, wantInter)
		}
		// Ring all-reduce: 2(n−1)/n·S = 2·7/8·64 B = 112.
		if ar := st[parallel.CollAllReduce]; ar.Sent() != 112 || ar.Recv() != 112 {
			t.Errorf("rank %d all-reduce %+v, want 112 each way", r, ar)
		}
		// All-to-all by real counts: sent Σ_{j≠r} ((r+j) mod 3)·5·2 B, split
		// by the node of j; received Σ_{j≠r} ((j+r) mod 3)·10 likewise.
		var intra, inter int64
		for j := 0; j < 8; j++ {
			if j == r {
				continue
			}
			b := int64((r+j)%3) * 10
			if j/4 == r/4 {
				intra += b
			} else {
				inter += b
			}
		}
		// Pipelined ring broadcast from rank 5 (S = 40 B): every rank but
		// the root's predecessor (4) sends S to its successor, every rank
		// but the root receives S. Rank 7 sends to 0 and rank 3 to 4 across
		// nodes; rank 0 and 4 receive across nodes.
		bc := st[parallel.CollBroadcast]
		wantSent, wantRecv := int64(40), int64(40)
		if r == 4 {
			wantSent = 0
		}
		if r == 5 {
			wantRecv = 0
		}
		if bc.Sent() != wantSent || bc.Recv() != wantRecv || (r == 7 || r == 3) != (bc.SentInter == 40) {
			t.Errorf("rank %d broadcast %+v, want %d sent, %d received", r, bc, wantSent, wantRecv)
		}
		a := st[parallel.CollAllToAll]
		if a.SentIntra != intra || a.SentInter != inter || a.RecvIntra != intra || a.RecvInter != inter {
			t.Errorf("rank %d all-to-all %+v, want intra %d inter %d each way", r, a, intra, inter)
		}
	}
	if tot := c.Stats.Total()[parallel.CollAllGather]; tot.Sent() != 8*42 || tot.Calls != 8 {
		t.Errorf("total all-gather %+v, want %d bytes in 8 calls", tot, 8*42)
	}
}

func TestCollectiveMismatch(t *testing.T) {
	c := testComm(t, 2, 1, 8)
	err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
		g := c.Mesh().Group(parallel.AxisShard, ep.Rank())
		_, err := ep.AllGather(ctx, g, moe.F32, make([]float32, 3+ep.Rank()))
		return err
	})
	var ce *Error
	if !errors.As(err, &ce) || ce.Reason != "mismatch" || !strings.Contains(err.Error(), "rank 0: all_gather f32 × 3") ||
		!strings.Contains(err.Error(), "rank 1: all_gather f32 × 4") {
		t.Errorf("size mismatch: %v", err)
	}
	err = c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
		g := c.Mesh().Group(parallel.AxisShard, ep.Rank())
		if ep.Rank() == 0 {
			return ep.AllReduce(ctx, g, moe.F32, make([]float32, 3))
		}
		_, err := ep.AllGather(ctx, g, moe.F32, make([]float32, 3))
		return err
	})
	if !errors.As(err, &ce) || ce.Reason != "mismatch" || !strings.Contains(err.Error(), "all_reduce") {
		t.Errorf("op mismatch: %v", err)
	}
	// Different groups: rank 0 enters dp_shard[0], rank 1 dp[0]; both groups
	// hold both ranks, so neither can complete: reported, not hung.
	err = c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
		a := c.Mesh().Group(parallel.AxisShard, ep.Rank())
		b := c.Mesh().Group(parallel.AxisDP, ep.Rank())
		if ep.Rank() == 1 {
			a, b = b, a
		}
		if err := ep.Barrier(ctx, a); err != nil {
			return err
		}
		return ep.Barrier(ctx, b)
	})
	if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "deadlock") || !strings.Contains(err.Error(), "dp_shard[0]") || !strings.Contains(err.Error(), "dp[0]") {
		t.Errorf("group mismatch: %v", err)
	}
}

func TestCollectiveTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testComm(t, 2, 1, 8)
		c.Timeout = time.Second
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			if ep.Rank() == 1 {
				// Slow "compute" (fake clock) that keeps finishing ops, so
				// not stalled, but never reaches the collective in time.
				for range 3600 {
					select {
					case <-time.After(100 * time.Millisecond):
						ep.Beat()
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			return ep.Barrier(ctx, c.Mesh().Group(parallel.AxisShard, ep.Rank()))
		})
		var ce *Error
		if !errors.As(err, &ce) || ce.Reason != "timeout" || !strings.Contains(err.Error(), "missing ranks [1]") {
			t.Errorf("timeout: %v", err)
		}
	})
}

func TestCollectiveRankFailure(t *testing.T) {
	c := testComm(t, 4, 2, 8)
	boom := errors.New("injected failure")
	var returned atomic.Int32
	errs := make([]error, 4)
	err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) (err error) {
		defer func() { errs[ep.Rank()] = err; returned.Add(1) }()
		g := c.Mesh().Group(parallel.AxisDP, ep.Rank())
		buf := make([]float32, 4)
		for step := 0; step < 10; step++ {
			if ep.Rank() == 2 && step == 3 {
				return boom // dies mid-step
			}
			if err := ep.AllReduce(ctx, g, moe.F32, buf); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("Run = %v, want rank 2's injected failure", err)
	}
	if returned.Load() != 4 {
		t.Errorf("%d of 4 ranks returned", returned.Load())
	}
	for r, e := range errs {
		if e == nil {
			t.Errorf("rank %d returned nil after rank 2 failed", r)
		}
	}
}

// FuzzAllGatherReduceScatter: all-gather ∘ reduce-scatter = all-reduce,
// bit for bit (both sum members left to right in group order).
func FuzzAllGatherReduceScatter(f *testing.F) {
	f.Add(uint8(3), uint8(2), []byte{1, 2, 3, 250, 7, 9, 11})
	f.Add(uint8(1), uint8(5), []byte{0})
	f.Add(uint8(4), uint8(1), []byte("reduce scatter then gather"))
	f.Fuzz(func(t *testing.T, n8, c8 uint8, data []byte) {
		n, ch := int(n8%4)+1, int(c8%5)+1
		c := testComm(t, n, 1, 8)
		val := func(r, k int) float32 {
			if len(data) == 0 {
				return 0
			}
			b := data[(r*n*ch+k)%len(data)]
			return float32(int8(b)) * float32(math.Pow(2, float64(int(b)%7-3))) / 3
		}
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			r := ep.Rank()
			g := c.Mesh().Group(parallel.AxisShard, r)
			x := make([]float32, n*ch)
			for k := range x {
				x[k] = val(r, k)
			}
			out := make([]float32, ch)
			if err := ep.ReduceScatter(ctx, g, moe.F32, x, out); err != nil {
				return err
			}
			ag, err := ep.AllGather(ctx, g, moe.F32, out)
			if err != nil {
				return err
			}
			if err := ep.AllReduce(ctx, g, moe.F32, x); err != nil {
				return err
			}
			for k := range x {
				if math.Float32bits(ag[k]) != math.Float32bits(x[k]) {
					t.Errorf("rank %d element %d: AG∘RS %v ≠ AR %v", r, k, ag[k], x[k])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDispatchCombine: an all-to-all with arbitrary uneven counts followed by
// the reverse all-to-all with the received counts returns every rank's rows
// unchanged (combine ∘ dispatch = identity).
func FuzzDispatchCombine(f *testing.F) {
	f.Add(uint8(4), []byte{0, 3, 1, 2, 5, 0, 0, 7, 1, 1, 2, 0, 4, 4, 0, 1})
	f.Add(uint8(2), []byte{})
	f.Add(uint8(3), []byte{9, 0, 0})
	f.Fuzz(func(t *testing.T, n8 uint8, data []byte) {
		n := int(n8%4) + 1
		c := testComm(t, n, 1, 1)
		const width = 3
		err := c.Run(context.Background(), func(ctx context.Context, ep *Endpoint) error {
			r := ep.Rank()
			g := c.Mesh().Group(parallel.AxisShard, r)
			counts := make([]int, n)
			total := 0
			for j := range counts {
				if len(data) > 0 {
					counts[j] = int(data[(r*n+j)%len(data)] % 6)
				}
				total += counts[j]
			}
			send := make([]float32, total*width)
			for k := range send {
				send[k] = float32(r*1000 + k)
			}
			recv, rc, err := ep.AllToAll(ctx, g, moe.BF16, send, counts, width)
			if err != nil {
				return err
			}
			back, bc, err := ep.AllToAll(ctx, g, moe.BF16, recv, rc, width)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(bc, counts) || len(back) != len(send) || (len(send) > 0 && !reflect.DeepEqual(back, send)) {
				t.Errorf("rank %d: combine∘dispatch changed rows: counts %v→%v", r, counts, bc)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
