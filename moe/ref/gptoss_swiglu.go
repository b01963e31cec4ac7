package ref

import (
	"math"

	"github.com/moescope/moescope/moe"
)

// The routed experts' activation: SwiGLU, or GPT-OSS's clamped SwiGLU
// (moe.SwiGLUClamp; GptOssExperts.forward, modeling_gpt_oss.py,
// transformers 00d4b3d2). With α = Alpha, λ = Limit, ĝ = min(g, λ) and
// û = clamp(u, −λ, λ):
//
//	σg = ĝ·σ(α·ĝ)   (glu),   a = (û + 1)·σg
//
// Backward, with torch.clamp's gradient passing where the input lies in
// the closed range (clamp_backward, derivatives.yaml) and s = σ(α·ĝ):
//
//	du = da·σg·[−λ ≤ u ≤ λ],   dg = da·(û + 1)·(s + α·ĝ·s·(1 − s))·[g ≤ λ]
//
// ffnActs keeps g and u before the clamps and σg in sg: the three tensors
// the accounting lists for the experts' activation (gate, silu_gate, up).

// expertAct computes the routed experts' σg and a from g and u.
func expertAct[T Float](c *moe.Config, s ffnActs[T]) {
	if c.Clamp == nil {
		swigluAct(s)
		return
	}
	alpha, lim := c.Clamp.Alpha, c.Clamp.Limit
	for i, g := range s.g {
		gc := min(float64(g), lim)
		uc := max(min(float64(s.u[i]), lim), -lim)
		s.sg[i] = T(gc / (1 + math.Exp(-alpha*gc)))
		s.a[i] = T(uc+1) * s.sg[i]
	}
}

// expertActBwd writes dg and du from da (expertAct's backward).
func expertActBwd[T Float](c *moe.Config, dg, du, da []T, s ffnActs[T]) {
	if c.Clamp == nil {
		swigluActBwd(dg, du, da, s)
		return
	}
	alpha, lim := c.Clamp.Alpha, c.Clamp.Limit
	for i, g := range s.g {
		u := float64(s.u[i])
		gc := min(float64(g), lim)
		uc := max(min(u, lim), -lim)
		sig := 1 / (1 + math.Exp(-alpha*gc))
		du[i], dg[i] = 0, 0
		if u >= -lim && u <= lim {
			du[i] = da[i] * s.sg[i]
		}
		if float64(g) <= lim {
			dg[i] = da[i] * T((uc+1)*(sig+alpha*gc*sig*(1-sig)))
		}
	}
}
