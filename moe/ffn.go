package moe

// SwiGLU feed-forward, y = W_down·(silu(W_gate·x) ⊙ W_up·x), over M rows:
//
//	g = x·W_gateᵀ, u = x·W_upᵀ [M,F];  σg = silu(g) = g·σ(g);  a = σg ⊙ u;  y = a·W_downᵀ [M,D]
//
// Backward: da = dy·W_down, dW_down += dyᵀ·a, dg = da ⊙ u ⊙ silu'(g) with
// silu'(g) = σ(g)·(1 + g·(1 − σ(g))), du = da ⊙ σg, dx += dg·W_gate + du·W_up,
// dW_gate += dgᵀ·x, dW_up += duᵀ·x.
//
// What backward reads is what PyTorch autograd keeps for
// F.silu(x@W_gateᵀ) * (x@W_upᵀ) @ W_downᵀ (torch 1.13 saved_tensors_hooks):
// mm keeps its input, silu its input g, mul both factors σg and u, and the
// last mm its input a. routed experts run the same maths per expert on the
// rows dispatched to it (a grouped GEMM; torch._grouped_mm keeps its inputs
// too, derivatives.yaml).

// ffnActs holds the SwiGLU intermediates of M rows.
type ffnActs[T Float] struct {
	g, sg, u, a []T // [M,F]
}

func newFFNActs[T Float](m, f int) ffnActs[T] {
	return ffnActs[T]{g: make([]T, m*f), sg: make([]T, m*f), u: make([]T, m*f), a: make([]T, m*f)}
}

// swigluAct computes σg = silu(g) and a = σg ⊙ u.
func swigluAct[T Float](s ffnActs[T]) {
	for i, g := range s.g {
		s.sg[i] = g * sigmoid(g)
		s.a[i] = s.sg[i] * s.u[i]
	}
}

// swigluActBwd turns da (overwritten with dg) into dg and du.
func swigluActBwd[T Float](dg, du, da []T, s ffnActs[T]) {
	for i, g := range s.g {
		sig := sigmoid(g)
		d := da[i]
		du[i] = d * s.sg[i]
		dg[i] = d * s.u[i] * sig * (1 + g*(1-sig))
	}
}

// localExperts runs every routed expert of a layer on this machine: one
// SwiGLU per expert over its rows, counted as grouped GEMMs.
type localExperts[T Float] struct {
	b      *Block[T]
	w, g   *LayerWeights[T] // weights and gradients of the current call
	xe     []T              // kept input rows [R, D]
	acts   ffnActs[T]       // kept intermediates [R, F]
	counts []int
}

// ExpertsForward implements ExpertStage.
func (l *localExperts[T]) ExpertsForward(layer int, xe []T, counts []int, pass Pass, keep bool) []T {
	c, ex := l.b.cfg, l.b.x
	D, F := c.Hidden, c.ExpertFFN
	R := len(xe) / D
	s := newFFNActs[T](R, F)
	ye := make([]T, R*D)
	off := 0
	for e, n := range counts {
		if n == 0 {
			continue
		}
		x := xe[off*D : (off+n)*D]
		g, u := s.g[off*F:(off+n)*F], s.u[off*F:(off+n)*F]
		linearFwd(g, x, l.w.ExpGate[e], n, F, D)
		linearFwd(u, x, l.w.ExpUp[e], n, F, D)
		off += n
	}
	ex.round(s.g)
	ex.round(s.u)
	swigluAct(s)
	ex.round(s.sg)
	ex.round(s.a)
	off = 0
	for e, n := range counts {
		if n == 0 {
			continue
		}
		linearFwd(ye[off*D:(off+n)*D], s.a[off*F:(off+n)*F], l.w.ExpDown[e], n, D, F)
		off += n
	}
	ex.round(ye)
	rfd := int64(R) * int64(F) * int64(D)
	ex.op(layer, OpExpertGate, pass, rfd)
	ex.op(layer, OpExpertUp, pass, rfd)
	ex.op(layer, OpExpertAct, pass, int64(R)*int64(F))
	ex.op(layer, OpExpertDown, pass, rfd)
	l.xe, l.acts, l.counts = nil, ffnActs[T]{}, nil
	if keep {
		l.xe, l.acts, l.counts = xe, s, counts
		if pass == Forward {
			ex.saved(layer, OpExpertGate, "input", len(xe), ex.act)
			ex.saved(layer, OpExpertAct, "gate", len(s.g), ex.act)
			ex.saved(layer, OpExpertAct, "silu_gate", len(s.sg), ex.act)
			ex.saved(layer, OpExpertAct, "up", len(s.u), ex.act)
			ex.saved(layer, OpExpertDown, "input", len(s.a), ex.act)
		}
	}
	return ye
}

// ExpertsBackward implements ExpertStage.
func (l *localExperts[T]) ExpertsBackward(layer int, dye []T) []T {
	c, ex := l.b.cfg, l.b.x
	D, F := c.Hidden, c.ExpertFFN
	R := len(dye) / D
	da := make([]T, R*F)
	dg, du := make([]T, R*F), make([]T, R*F)
	dxe := make([]T, R*D)
	off := 0
	for e, n := range l.counts {
		if n == 0 {
			continue
		}
		dy := dye[off*D : (off+n)*D]
		linearBwdX(da[off*F:(off+n)*F], dy, l.w.ExpDown[e], n, D, F)
		linearBwdW(l.g.ExpDown[e], dy, l.acts.a[off*F:(off+n)*F], n, D, F)
		off += n
	}
	swigluActBwd(dg, du, da, l.acts)
	off = 0
	for e, n := range l.counts {
		if n == 0 {
			continue
		}
		x, dx := l.xe[off*D:(off+n)*D], dxe[off*D:(off+n)*D]
		g, u := dg[off*F:(off+n)*F], du[off*F:(off+n)*F]
		linearBwdX(dx, g, l.w.ExpGate[e], n, F, D)
		linearBwdX(dx, u, l.w.ExpUp[e], n, F, D)
		linearBwdW(l.g.ExpGate[e], g, x, n, F, D)
		linearBwdW(l.g.ExpUp[e], u, x, n, F, D)
		off += n
	}
	rfd := int64(R) * int64(F) * int64(D)
	for _, op := range []Op{OpExpertDown, OpExpertGate, OpExpertUp} {
		ex.op(layer, op, BackwardData, rfd)
		ex.op(layer, op, BackwardWeight, rfd)
	}
	ex.op(layer, OpExpertAct, BackwardData, int64(R)*int64(F))
	l.xe, l.acts, l.counts = nil, ffnActs[T]{}, nil
	return dxe
}
