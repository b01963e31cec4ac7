package ref

import (
	"errors"
	"fmt"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref/scratch"
	"math"
	"math/rand/v2"
)

// Model is the reference implementation of a Config: parameters (and their
// gradients) stored flat in Config.Params() order, so that safetensors I/O
// by Hugging Face name is a copy per tensor.
type Model[T Float] struct {
	Cfg    *moe.Config
	Params []moe.Param // Cfg.Params()
	Data   []T         // every parameter, flat, in Params order
	Grad   []T         // gradients, same layout (zero for buffers)
	// Load[l][e] counts the (token, slot) pairs routed to expert e of layer
	// l by ForwardBackward (Evaluate does not count) since the last
	// ResetLoad (nil for dense layers).
	Load [][]int64

	offs []int // Params[i] is Data[offs[i]:offs[i+1]]
	opt  AdamState[T]
}

// NewModel allocates a zero model for a valid config. A config with RoPE
// scaling other than YaRN is refused: this implementation rotates with
// plain or YaRN frequencies only and would compute another model's loss and
// gradients.
func NewModel[T Float](c *moe.Config) (*Model[T], error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.RopeScaling != "" && c.RopeScaling != "yarn" {
		return nil, fmt.Errorf("%s: rope_scaling with rope_type %q is not implemented by the reference model (only plain RoPE and yarn); FLOP and memory accounting do not depend on it", c.Name, c.RopeScaling)
	}
	m := &Model[T]{Cfg: c, Params: c.Params()}
	n := 0
	m.offs = append(m.offs, 0)
	for _, p := range m.Params {
		n += int(p.Elements())
		m.offs = append(m.offs, n)
	}
	m.Data, m.Grad = make([]T, n), make([]T, n)
	m.Load = make([][]int64, c.Layers)
	for l := range m.Load {
		if c.MoELayer[l] {
			m.Load[l] = make([]int64, c.Experts)
		}
	}
	// The views must line up with Params; check once so a change of
	// Params' order fails here, not silently.
	if _, err := layerViews(c, m.Params, m.tensors(m.Data)); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Model[T]) tensors(flat []T) [][]T {
	ts := make([][]T, len(m.Params))
	for i := range ts {
		ts[i] = flat[m.offs[i]:m.offs[i+1]:m.offs[i+1]]
	}
	return ts
}

// Tensors returns views of every parameter in Params order (for SaveParams).
func (m *Model[T]) Tensors() [][]T { return m.tensors(m.Data) }

// Grads returns views of every gradient in Params order.
func (m *Model[T]) Grads() [][]T { return m.tensors(m.Grad) }

// SetTensors copies ts (Params order, as LoadParams returns) into the model.
func (m *Model[T]) SetTensors(ts [][]T) error {
	if len(ts) != len(m.Params) {
		return fmt.Errorf("SetTensors: %d tensors, model has %d", len(ts), len(m.Params))
	}
	for i, t := range ts {
		if len(t) != m.offs[i+1]-m.offs[i] {
			return fmt.Errorf("SetTensors: %s has %d elements, want %d", m.Params[i].Name, len(t), m.offs[i+1]-m.offs[i])
		}
	}
	for i, t := range ts {
		copy(m.Data[m.offs[i]:], t)
	}
	return nil
}

// Tensor returns the view of the named parameter, or nil.
func (m *Model[T]) Tensor(name string) []T {
	for i, p := range m.Params {
		if p.Name == name {
			return m.Data[m.offs[i]:m.offs[i+1]]
		}
	}
	return nil
}

// InitRandom fills every parameter deterministically from seed: normal
// with std Config.InitRange for matrices (HF's _init_weights for Linear and
// Embedding), ones for RMSNorm weights, zeros for biases and the selection
// bias (the initialization HF's modules use).
func (m *Model[T]) InitRandom(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x6d6f6573636f7065))
	std := m.Cfg.InitRange
	for i, p := range m.Params {
		v := m.Data[m.offs[i]:m.offs[i+1]]
		switch {
		case p.Group == moe.GroupNorm:
			for j := range v {
				v[j] = 1
			}
		case len(p.Shape) == 1:
			clear(v)
		default:
			for j := range v {
				v[j] = T(r.NormFloat64() * std)
			}
		}
	}
}

// ZeroGrad clears the gradients.
func (m *Model[T]) ZeroGrad() { clear(m.Grad) }

// ResetLoad clears the per-expert load counters.
func (m *Model[T]) ResetLoad() {
	for _, l := range m.Load {
		clear(l)
	}
}

// weights are per-layer views plus embedding, final norm and LM head.
type weights[T Float] struct {
	layers []LayerWeights[T]
	global GlobalWeights[T]
}

// layerViews assigns the flat tensors (Params order) to their roles,
// walking Params' fixed order and checking every size.
func layerViews[T Float](c *moe.Config, ps []moe.Param, ts [][]T) (*weights[T], error) {
	w := &weights[T]{layers: make([]LayerWeights[T], c.Layers)}
	i := 0
	var err error
	next := func(n int) []T {
		if err != nil {
			return nil
		}
		if i >= len(ts) || len(ts[i]) != n {
			name := "(none)"
			if i < len(ps) {
				name = ps[i].Name
			}
			err = fmt.Errorf("moe: parameter %d (%s) is not the expected tensor of %d elements", i, name, n)
			return nil
		}
		i++
		return ts[i-1]
	}
	D, q, kv := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	w.global.Embed = next(c.Vocab * D)
	for l := range w.layers {
		lw := &w.layers[l]
		lw.AttnNorm = next(D)
		if c.IsMLA() {
			mlaViews(c, lw, next)
		} else {
			lw.Wq = next(q * D)
			if c.QKVBias {
				lw.Bq = next(q)
			}
			lw.Wk = next(kv * D)
			if c.QKVBias {
				lw.Bk = next(kv)
			}
			lw.Wv = next(kv * D)
			if c.QKVBias {
				lw.Bv = next(kv)
			}
			lw.Wo = next(D * q)
			if c.OProjBias {
				lw.Bo = next(D)
			}
			if c.AttnSinks {
				lw.Sinks = next(c.Heads)
			}
			switch c.QKNorm {
			case moe.QKNormHead:
				lw.QNorm, lw.KNorm = next(c.HeadDim), next(c.HeadDim)
			case moe.QKNormFull:
				lw.QNorm, lw.KNorm = next(q), next(kv)
			}
		}
		lw.FFNNorm = next(D)
		if !c.MoELayer[l] {
			lw.DenseGate, lw.DenseUp, lw.DenseDown = next(c.DenseFFN*D), next(c.DenseFFN*D), next(D*c.DenseFFN)
			continue
		}
		lw.Router = next(c.Experts * D)
		if c.RouterBias {
			lw.RouterBias = next(c.Experts)
		}
		if c.SelectionBias {
			lw.SelBias = next(c.Experts)
		}
		expertViews(c, lw, next)
		if c.SharedExperts > 0 {
			S := c.SharedExperts * c.SharedFFN
			lw.SharedGate, lw.SharedUp, lw.SharedDown = next(S*D), next(S*D), next(D*S)
			if c.SharedGated {
				lw.SharedExpGate = next(D)
			}
		}
	}
	w.global.FinalNorm = next(D)
	if c.TiedEmbeddings {
		w.global.LMHead = w.global.Embed
	} else {
		w.global.LMHead = next(c.Vocab * D)
	}
	if err == nil && i != len(ts) {
		err = fmt.Errorf("moe: %d parameters left unassigned", len(ts)-i)
	}
	return w, err
}

// Layer returns views of layer l's weights and gradients (for a parallel
// rank that shards them, or for inspection).
func (m *Model[T]) Layer(l int) (w, g LayerWeights[T]) {
	ww, _ := layerViews(m.Cfg, m.Params, m.Tensors())
	gg, _ := layerViews(m.Cfg, m.Params, m.Grads())
	return ww.layers[l], gg.layers[l]
}

// Globals returns views of the embedding, final norm and LM head weights
// and gradients.
func (m *Model[T]) Globals() (w, g GlobalWeights[T]) {
	ww, _ := layerViews(m.Cfg, m.Params, m.Tensors())
	gg, _ := layerViews(m.Cfg, m.Params, m.Grads())
	return ww.global, gg.global
}

// Views assigns tensors given in Params order (all of them: a rank's
// gathered copy, say) to their roles; sizes are checked.
func Views[T Float](c *moe.Config, tensors [][]T) ([]LayerWeights[T], GlobalWeights[T], error) {
	w, err := layerViews(c, c.Params(), tensors)
	if err != nil {
		return nil, GlobalWeights[T]{}, err
	}
	return w.layers, w.global, nil
}

// Result is the outcome of one micro-batch (or the mean over micro-batches).
type Result struct {
	Loss   float64 // cross-entropy, mean over predicted positions
	Aux    float64 // aux loss, AuxLoss's formula (0 when not computed)
	Total  float64 // Loss + AuxCoef·Aux: what the gradient is of
	Tokens int     // predicted positions
}

// checkTokens validates a micro-batch of equal-length id sequences.
func checkTokens(c *moe.Config, tokens [][]int) (batch, seq int, err error) {
	if len(tokens) == 0 {
		return 0, 0, errors.New("tokens: empty micro-batch")
	}
	n := len(tokens[0])
	if n < 2 {
		return 0, 0, fmt.Errorf("tokens[0] has %d ids: need at least 2 (inputs and a next-token label)", n)
	}
	for i, s := range tokens {
		if len(s) != n {
			return 0, 0, fmt.Errorf("tokens[%d] has %d ids, tokens[0] has %d: sequences must have equal length", i, len(s), n)
		}
		for j, id := range s {
			if id < 0 || id >= c.Vocab {
				return 0, 0, fmt.Errorf("tokens[%d][%d] = %d: must be in [0, vocab = %d)", i, j, id, c.Vocab)
			}
		}
	}
	return len(tokens), n - 1, nil
}

// ForwardBackward runs one micro-batch: tokens[i] is a sequence of s+1 ids
// whose first s are inputs and last s the labels. It accumulates
// scale·∂(Loss + AuxCoef·Aux)/∂θ into Grad (pass scale = 1/micro-batches
// for gradient accumulation) and the routing counts into Load.
func (m *Model[T]) ForwardBackward(tokens [][]int, scale float64, o Options) (Result, error) {
	return m.run(tokens, scale, o, true)
}

// Evaluate runs forward only and returns the losses; gradients and loads
// are untouched, nothing is kept.
func (m *Model[T]) Evaluate(tokens [][]int, o Options) (Result, error) {
	o.AC = moe.AC{Mode: moe.ACFull} // keep nothing but block inputs
	return m.run(tokens, 1, o, false)
}

func (m *Model[T]) run(tokens [][]int, scale float64, o Options, backward bool) (Result, error) {
	c := m.Cfg
	batch, seq, err := checkTokens(c, tokens)
	if err != nil {
		return Result{}, err
	}
	if o.AuxCoef != 0 {
		if err := CheckAux(c); err != nil {
			return Result{}, err
		}
		if math.IsNaN(o.AuxCoef) || math.IsInf(o.AuxCoef, 0) {
			return Result{}, fmt.Errorf("aux coefficient = %v: must be finite", o.AuxCoef)
		}
	}
	if err := o.AC.Validate(); err != nil {
		return Result{}, err
	}
	ex := newExec(o)
	data := m.Data
	if o.BF16 {
		data = append([]T(nil), m.Data...)
		roundBF16(data)
	}
	w, err := layerViews(c, m.Params, m.tensors(data))
	if err != nil {
		return Result{}, err
	}
	g, _ := layerViews(c, m.Params, m.Grads())

	T_ := batch * seq
	ids, labels := make([]int, T_), make([]int, T_)
	for i, s := range tokens {
		for j := 0; j < seq; j++ {
			ids[i*seq+j], labels[i*seq+j] = s[j], s[j+1]
		}
	}
	emb := NewEmbedding[T](c, o)
	emb.x = ex
	x := emb.Forward(w.global.Embed, ids)
	blocks := make([]*Block[T], c.Layers)
	done, total := 0, c.Layers
	if backward {
		total *= 2
	}
	tick := func() {
		if done++; o.Progress != nil {
			o.Progress(done, total)
		}
	}
	pool := scratch.NewPool[T]()
	for l := range blocks {
		b := NewBlock[T](c, l, batch, seq, o)
		b.x = ex
		b.shareScratch(pool)
		blocks[l] = b
		x = b.Forward(&w.layers[l], x)
		if backward {
			for e, n := range b.ExpertCounts() {
				m.Load[l][e] += int64(n)
			}
		}
		tick()
	}
	head := NewHead[T](c, o)
	head.x = ex
	res := Result{Tokens: T_}
	res.Loss = head.Forward(&w.global, x, labels)
	var auxGrad [][]T
	if o.AuxCoef != 0 && c.MoELayers() > 0 {
		res.Aux, auxGrad = AuxLoss(c, blocks, scale*o.AuxCoef)
	}
	res.Total = res.Loss + o.AuxCoef*res.Aux
	if !backward {
		return res, nil
	}

	dx := head.Backward(&w.global, &g.global, scale)
	for l := c.Layers - 1; l >= 0; l-- {
		var ag []T
		if auxGrad != nil {
			ag = auxGrad[l]
		}
		dx = blocks[l].Backward(&w.layers[l], &g.layers[l], dx, ag)
		tick()
	}
	emb.Backward(g.global.Embed, dx)
	return res, nil
}

// Accumulate runs every micro-batch with scale 1/len(micro) after clearing
// the gradients, so Grad holds the gradient of the mean loss, and returns
// the mean results.
func (m *Model[T]) Accumulate(micro [][][]int, o Options) (Result, error) {
	if len(micro) == 0 {
		return Result{}, errors.New("no micro-batches")
	}
	m.ZeroGrad()
	var sum Result
	for _, mb := range micro {
		r, err := m.ForwardBackward(mb, 1/float64(len(micro)), o)
		if err != nil {
			return Result{}, err
		}
		sum.Loss += r.Loss
		sum.Aux += r.Aux
		sum.Total += r.Total
		sum.Tokens += r.Tokens
	}
	n := float64(len(micro))
	sum.Loss, sum.Aux, sum.Total = sum.Loss/n, sum.Aux/n, sum.Total/n
	return sum, nil
}

// Step applies one AdamW step to every trained parameter (buffers such as
// the selection bias excluded) from Grad.
func (m *Model[T]) Step(a AdamW) { m.StepRecorded(a, nil) }

// StepRecorded is Step reporting, per layer, an optimizer record (pass
// Forward) whose count is the number of parameters updated: decoder layers
// by index, the embedding as LayerEmbed, final norm and LM head as
// LayerHead.
func (m *Model[T]) StepRecorded(a AdamW, rec moe.Recorder) {
	if m.opt.M == nil {
		m.opt.M, m.opt.V = make([]T, len(m.Data)), make([]T, len(m.Data))
	}
	step := m.opt.Step
	for i, p := range m.Params {
		if p.Buffer {
			continue
		}
		lo, hi := m.offs[i], m.offs[i+1]
		st := AdamState[T]{Step: step, M: m.opt.M[lo:hi], V: m.opt.V[lo:hi]}
		AdamWStep(a, &st, m.Data[lo:hi], m.Grad[lo:hi])
		if rec != nil {
			l := p.Layer
			switch {
			case p.Group == moe.GroupEmbedding:
				l = moe.LayerEmbed
			case l < 0:
				l = m.Cfg.LayerHead()
			}
			rec.RecordOp(moe.OpRecord{Layer: l, Op: moe.OpOptimizer, Pass: moe.Forward, Count: int64(hi - lo)})
		}
	}
	m.opt.Step++
}

// UpdateSelectionBias applies torchtitan's load-balancing update to every
// MoE layer's selection bias from loads[l][e] (summed over the step's
// micro-batches and data-parallel ranks): δ_e = rate·sign(mean − load_e),
// δ −= mean(δ), bias += δ. No-op without a selection bias.
func (m *Model[T]) UpdateSelectionBias(loads [][]int64, rate float64) {
	if !m.Cfg.SelectionBias {
		return
	}
	w, _ := layerViews(m.Cfg, m.Params, m.Tensors())
	for l, lw := range w.layers {
		if lw.SelBias == nil || l >= len(loads) || loads[l] == nil {
			continue
		}
		E := len(lw.SelBias)
		var mean float64
		for _, n := range loads[l] {
			mean += float64(n)
		}
		mean /= float64(E)
		delta := make([]float64, E)
		var dm float64
		for e, n := range loads[l] {
			switch {
			case mean > float64(n):
				delta[e] = rate
			case mean < float64(n):
				delta[e] = -rate
			}
			dm += delta[e]
		}
		dm /= float64(E)
		for e := range delta {
			lw.SelBias[e] += T(delta[e] - dm)
		}
	}
}
