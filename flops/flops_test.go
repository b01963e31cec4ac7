package flops

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// handConfig is the built-in "tiny" written out: V 64, D 32, L 2, H 4, G 2,
// d 8, layer 0 dense (Fd 48), layer 1 MoE (E 4, K 2, F 16), per-head QK
// norm, untied embeddings.
func handConfig() *moe.Config {
	return &moe.Config{
		Name: "hand", ModelType: "qwen3_moe",
		Vocab: 64, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
		DenseFFN: 48, MoELayer: []bool{false, true}, Window: []int{0, 0},
		Experts: 4, TopK: 2, ExpertFFN: 16,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true,
		QKNorm: moe.QKNormHead, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6,
		AuxLossCoef: 0.001, InitRange: 0.02,
	}
}

var (
	acNone      = moe.AC{Mode: moe.ACNone}
	acSelective = moe.AC{Mode: moe.ACSelective}
	acFull      = moe.AC{Mode: moe.ACFull}
)

func TestAttentionEntries(t *testing.T) {
	for _, tc := range []struct {
		s, w int
		tile Tile
		want int64
	}{
		{4096, 0, ExactTile, 4096 * 4097 / 2},
		{10, 3, ExactTile, 3*4/2 + 7*3}, // w(w+1)/2 + (s-w)·w
		{10, 20, ExactTile, 55},         // window longer than the sequence
		// s = 5, 2×2 tiles: rows 0-1 see keys 0-1 (one tile, 2×2 = 4); rows 2-3
		// keys 0-3 (two tiles, 2×4 = 8); row 4 keys 0-4 (three tiles clipped to
		// width 5, 1×5 = 5): 17.
		{5, 0, Tile{2, 2}, 17},
		// s = 8, 4×4: 4·4 + 4·8 = 48.
		{8, 0, Tile{4, 4}, 48},
		// s = 8, w = 2, 4×4: rows 0-3 keys 0-3 (16); rows 4-7 keys 3-7 -> tiles
		// 0 and 1 (4·8 = 32): 48.
		{8, 2, Tile{4, 4}, 48},
	} {
		if got := AttentionEntries(tc.s, tc.w, tc.tile); got != tc.want {
			t.Errorf("AttentionEntries(%d, %d, %v) = %d, want %d", tc.s, tc.w, tc.tile, got, tc.want)
		}
	}
}

// bruteEntries counts tile areas by testing every score of every tile.
func bruteEntries(s, w int, tile Tile) int64 {
	var n int64
	for r0 := 0; r0 < s; r0 += tile.Rows {
		for c0 := 0; c0 < s; c0 += tile.Cols {
			r1, c1 := min(r0+tile.Rows, s), min(c0+tile.Cols, s)
			hit := false
			for i := r0; i < r1 && !hit; i++ {
				for j := c0; j < c1; j++ {
					if j <= i && (w == 0 || j > i-w) {
						hit = true
						break
					}
				}
			}
			if hit {
				n += int64((r1 - r0) * (c1 - c0))
			}
		}
	}
	return n
}

func FuzzAttentionEntries(f *testing.F) {
	f.Add(uint8(5), uint8(0), uint8(2), uint8(2))
	f.Add(uint8(37), uint8(7), uint8(4), uint8(3))
	f.Add(uint8(64), uint8(1), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, s, w, r, c uint8) {
		S, W, tile := int(s)%80+1, int(w)%90, Tile{int(r)%17 + 1, int(c)%17 + 1}
		if got, want := AttentionEntries(S, W, tile), bruteEntries(S, W, tile); got != want {
			t.Fatalf("AttentionEntries(%d, %d, %v) = %d, brute force %d", S, W, tile, got, want)
		}
	})
}

func TestCountParamsHand(t *testing.T) {
	p, err := CountParams(handConfig())
	if err != nil {
		t.Fatal(err)
	}
	// embed 64·32 = 2048, LM head 2048, final norm 32; per layer attention
	// 2·32·32 + 2·16·32 = 3072 and norms 2·32 + 2·8 = 80; dense FFN 3·48·32 =
	// 4608; router 4·32 = 128; routed 4·3·16·32 = 6144 (active 2·3·16·32 = 3072).
	want := map[moe.ParamGroup]int64{moe.GroupEmbedding: 2048, moe.GroupLMHead: 2048, moe.GroupNorm: 32 + 160,
		moe.GroupAttention: 6144, moe.GroupDenseFFN: 4608, moe.GroupRouter: 128, moe.GroupRouted: 6144}
	for g, w := range want {
		if p.ByGroup[g] != w {
			t.Errorf("group %s = %d, want %d", g, p.ByGroup[g], w)
		}
	}
	if p.Total != 21312 || p.Active != 21312-6144+3072 {
		t.Errorf("total %d active %d, want 21312 18240", p.Total, p.Active)
	}
}

// TestCountParamsMatchesParamList checks the closed form against the
// tensor list of moe.Config.Params for every built-in and variants.
func TestCountParamsMatchesParamList(t *testing.T) {
	var cfgs []*moe.Config
	for _, n := range hf.Builtins() {
		c, err := hf.Load(n)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, c)
	}
	g := handConfig()
	g.SharedExperts, g.SharedFFN, g.SharedGated, g.QKVBias, g.QKNorm, g.TiedEmbeddings = 2, 8, true, true, moe.QKNormFull, true
	cfgs = append(cfgs, g)
	for _, c := range cfgs {
		p, err := CountParams(c)
		if err != nil {
			t.Fatal(err)
		}
		var total, active int64
		byGroup := map[moe.ParamGroup]int64{}
		for _, x := range c.Params() {
			if x.Buffer {
				continue
			}
			total += x.Elements()
			byGroup[x.Group] += x.Elements()
			if x.Group != moe.GroupRouted || x.Expert < c.TopK {
				active += x.Elements() // any K experts of a layer have the same size
			}
		}
		if total != p.Total || active != p.Active {
			t.Errorf("%s: CountParams %d/%d, Params() %d/%d", c.Name, p.Total, p.Active, total, active)
		}
		for grp, n := range byGroup {
			if p.ByGroup[grp] != n {
				t.Errorf("%s: group %s %d, Params() %d", c.Name, grp, p.ByGroup[grp], n)
			}
		}
	}
}

// sumPass adds the counts of records matching op (any op when "") and pass.
func sumPass(recs []moe.OpRecord, layer int, op moe.Op, pass moe.Pass) int64 {
	var n int64
	for _, r := range recs {
		if (layer == -2 || r.Layer == layer) && (op == "" || r.Op == op) && r.Pass == pass {
			n += r.Count
		}
	}
	return n
}

func TestOpsUniqueKeys(t *testing.T) {
	recs, err := Ops(handConfig(), Shape{Seq: 8, Batch: 2}, acFull, DefaultTile)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		l  int
		op moe.Op
		p  moe.Pass
	}
	seen := map[key]bool{}
	for _, r := range recs {
		k := key{r.Layer, r.Op, r.Pass}
		if seen[k] {
			t.Errorf("duplicate record %+v", k)
		}
		seen[k] = true
		if r.Count <= 0 {
			t.Errorf("non-positive count %+v", r)
		}
	}
}

// TestHandConventions works the tiny config at s = 8, b = 2 (T = 16) by hand.
func TestHandConventions(t *testing.T) {
	c, s := handConfig(), Shape{Seq: 8, Batch: 2}
	// Forward matmul counts (multiply-adds):
	//   attention projections per layer T·(q·D + 2·kv·D + D·q) = 16·3072 = 49152
	//   attention core per layer 2·n·d·H·b, n = 8·9/2 = 36: 2·36·8·4·2 = 4608
	//   dense FFN (layer 0) 16·3·48·32 = 73728
	//   router (layer 1) 16·4·32 = 2048; experts 16·2·3·16·32 = 49152
	//   LM head 16·64·32 = 32768
	// Σ = 2·49152 + 2·4608 + 73728 + 2048 + 49152 + 32768 = 265216.
	// Forward + backward_data + backward_weight = 3× (attention 2nd + 4nd = 6nd),
	// 2 FLOPs per multiply-add: model = 6·265216.
	const model = 6 * 265216
	// Flash recompute: n·d·H·b = 2304 per layer.
	const flash = 2 * 2304
	for _, tc := range []struct {
		ac   moe.AC
		tile Tile
		want int64
	}{
		{acNone, ExactTile, model + 2*flash},
		// full: every block forward matmul again: 265216 − 32768 (LM head).
		{acFull, ExactTile, model + 2*flash + 2*(265216-32768)},
		// selective: k (16·16·32 = 8192) and o (16·32·32 = 16384) in both
		// layers, up (16·48·32 = 24576) in layer 0, router 2048 and experts
		// 49152 in layer 1.
		{acSelective, ExactTile, model + 2*flash + 2*(2*8192+2*16384+24576+2048+49152)},
		// layer:2: block 1 only: 49152 + 4608 + 2048 + 49152.
		{moe.AC{Mode: moe.ACLayer, Every: 2}, ExactTile, model + 2*flash + 2*(49152+4608+2048+49152)},
		// 4×4 tiles: n = 48 instead of 36, so each layer's attention
		// (2 + 4 + 1)·n·d·H·b = 7·3072 instead of 6·2304 + 2304.
		{acNone, Tile{4, 4}, model + 2*flash + 2*2*(7*3072-7*2304)},
	} {
		got, err := HardwarePerStep(c, s, tc.ac, tc.tile)
		if err != nil || got != tc.want {
			t.Errorf("hardware(%v, %v) = %d, %v; want %d", tc.ac, tc.tile, got, err, tc.want)
		}
	}
	tot, err := Count(c, s, acSelective, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	// torchtitan: N_mm = 21312 − 2048 (embedding) − 6144 (routed) + 6144·2/4 = 16192;
	// per token 6·16192 + Σ_layers 6·H·2d·s = 97152 + 2·6·4·16·8 = 103296.
	// PaLM: 6·16192 + 12·L·H·d·s = 97152 + 12·2·4·8·8 = 103296.
	// Megatron per token: MLP 6·32·(3·48·1 + 3·16·2·1) = 46080; attention
	// projections 2·6·(32·(32+2·16) + 32·32) = 36864; logits 6·32·128 (64
	// padded to 128) = 24576; per step ×16 plus core b·s²·L·6·q =
	// 2·64·2·6·32 = 49152.
	want := map[Convention]int64{
		Torchtitan: 16 * 103296,
		PaLM:       16 * 103296,
		Megatron:   16*(46080+36864+24576) + 49152,
		Model:      model,
	}
	for cv, w := range want {
		if tot.PerStep[cv] != w {
			t.Errorf("%s per step = %d, want %d", cv, tot.PerStep[cv], w)
		}
		if tot.PerToken[cv] != float64(w)/16 {
			t.Errorf("%s per token = %g, want %g", cv, tot.PerToken[cv], float64(w)/16)
		}
	}
}

// TestSelectiveParity checks which linears selective recomputes: every
// second mm/linear of a block, router not counted.
func TestSelectiveParity(t *testing.T) {
	c := handConfig()
	c.SharedExperts, c.SharedFFN, c.SharedGated = 1, 8, true
	recs, err := Ops(c, Shape{Seq: 4, Batch: 1}, acSelective, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	re := func(l int, op moe.Op) bool { return sumPass(recs, l, op, moe.Recompute) > 0 }
	// Dense block: q k v o gate up down -> saved, recomputed, saved, ...
	for i, op := range []moe.Op{moe.OpQProj, moe.OpKProj, moe.OpVProj, moe.OpOProj, moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseDown} {
		if re(0, op) != (i%2 == 1) {
			t.Errorf("dense layer: %s recomputed = %v", op, re(0, op))
		}
	}
	// MoE block: q k v o, shared gate up down, shared_expert_gate.
	for i, op := range []moe.Op{moe.OpQProj, moe.OpKProj, moe.OpVProj, moe.OpOProj, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedDown, moe.OpSharedExpGate} {
		if re(1, op) != (i%2 == 1) {
			t.Errorf("moe layer: %s recomputed = %v", op, re(1, op))
		}
	}
	for _, op := range []moe.Op{moe.OpRouter, moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertDown, moe.OpRouterTopK, moe.OpAttnNorm, moe.OpRoPE, moe.OpSharedScale, moe.OpResidual} {
		if !re(1, op) {
			t.Errorf("moe layer: %s not recomputed", op)
		}
	}
	// Attention: only flash's n·d (n = 10, d 8, H 4).
	if got := sumPass(recs, 1, moe.OpAttn, moe.Recompute); got != 10*8*4 {
		t.Errorf("attention recompute %d, want 320", got)
	}
	for _, op := range []moe.Op{moe.OpEmbed, moe.OpLMHead, moe.OpLoss, moe.OpFinalNorm} {
		if sumPass(recs, -2, op, moe.Recompute) != 0 {
			t.Errorf("%s recomputed outside blocks", op)
		}
	}
}

func TestOpsAuxLossAndElementwise(t *testing.T) {
	c := handConfig()
	recs, _ := Ops(c, Shape{Seq: 8, Batch: 2}, acNone, ExactTile)
	if sumPass(recs, -2, moe.OpAuxLoss, moe.Forward) != 0 {
		t.Error("aux_loss without output_router_logits")
	}
	c.OutputRouterLogits = true
	recs, _ = Ops(c, Shape{Seq: 8, Batch: 2}, acFull, ExactTile)
	// T·E = 64 forward and backward_data, never recomputed.
	if sumPass(recs, 1, moe.OpAuxLoss, moe.Forward) != 64 || sumPass(recs, 1, moe.OpAuxLoss, moe.BackwardData) != 64 || sumPass(recs, 1, moe.OpAuxLoss, moe.Recompute) != 0 {
		t.Error("aux_loss records wrong")
	}
	// Elementwise table of moe/ops.go, T = 16, D 32, r = 8, K 2, F 16, V 64.
	for _, tc := range []struct {
		l        int
		op       moe.Op
		f, bd, w int64
	}{
		{moe.LayerEmbed, moe.OpEmbed, 16 * 32, 0, 16 * 32},
		{0, moe.OpRoPE, 16 * 6 * 8, 16 * 6 * 8, 0},
		{0, moe.OpResidual, 2 * 16 * 32, 0, 0},
		{0, moe.OpQNorm, 16 * 32, 16 * 32, 16 * 32},
		{0, moe.OpKNorm, 16 * 16, 16 * 16, 16 * 16},
		{0, moe.OpDenseAct, 16 * 48, 16 * 48, 0},
		{1, moe.OpDispatch, 16 * 2 * 32, 16 * 2 * 32, 0},
		{1, moe.OpExpertAct, 16 * 2 * 16, 16 * 2 * 16, 0},
		{2, moe.OpLoss, 16 * 64, 16 * 64, 0},
	} {
		f, bd, w := sumPass(recs, tc.l, tc.op, moe.Forward), sumPass(recs, tc.l, tc.op, moe.BackwardData), sumPass(recs, tc.l, tc.op, moe.BackwardWeight)
		if f != tc.f || bd != tc.bd || w != tc.w {
			t.Errorf("layer %d %s: %d/%d/%d, want %d/%d/%d", tc.l, tc.op, f, bd, w, tc.f, tc.bd, tc.w)
		}
	}
}

// TestQwen3WorkedExample derives shared/REFERENCES.md's Qwen3-30B-A3B
// figures at s = 4096 independently of the code's formulas.
func TestQwen3WorkedExample(t *testing.T) {
	c, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	// V 151936, D 2048, L 48, H 32, G 4, d 128, E 128, K 8, F 768.
	// Per layer: attention 2048·(4096+512+512) + 4096·2048 = 18,874,368;
	// norms 2·2048 + 2·128 = 4,352; router 128·2048 = 262,144; experts
	// 128·3·768·2048 = 603,979,776 (8 active: 37,748,736).
	// Embedding and LM head 151936·2048 = 311,164,928 each; final norm 2048.
	const (
		emb      = 311164928
		perLayer = 18874368 + 4352 + 262144
		experts  = 603979776
		active8  = 37748736
	)
	total := int64(2*emb + 2048 + 48*(perLayer+experts))
	active := int64(2*emb + 2048 + 48*(perLayer+active8))
	if total != 30532122624 || active != 3353032704 {
		t.Fatalf("hand derivation itself is off: %d %d", total, active)
	}
	p, err := CountParams(c)
	if err != nil || p.Total != total || p.Active != active {
		t.Errorf("CountParams = %d/%d, %v; want %d/%d", p.Total, p.Active, err, total, active)
	}
	tot, err := Count(c, Shape{Seq: 4096, Batch: 1}, acSelective, DefaultTile)
	if err != nil {
		t.Fatal(err)
	}
	// torchtitan: N_mm = active − embedding = 3,041,867,776; 6·N_mm +
	// 6·48·32·256·4096 = 18,251,206,656 + 9,663,676,416.
	if got := tot.PerToken[Torchtitan]; got != 27914883072 {
		t.Errorf("torchtitan %v, want 27,914,883,072", got)
	}
	// Megatron: MLP 6·2048·3·768·8·48 = 10,871,635,968; attention projections
	// 48·6·18,874,368 = 5,435,817,984; logits 6·2048·151936 = 1,866,989,568;
	// core 6·4096·4096·48 = 4,831,838,208.
	if got := tot.PerToken[Megatron]; got != 10871635968+5435817984+1866989568+4831838208 {
		t.Errorf("megatron %v, want 23,006,281,728", got)
	}
}

func TestSlidingWindowTorchtitan(t *testing.T) {
	c := handConfig()
	c.Window = []int{3, 0}
	a, _ := TorchtitanPerStep(handConfig(), Shape{Seq: 8, Batch: 1})
	b, _ := TorchtitanPerStep(c, Shape{Seq: 8, Batch: 1})
	// Layer 0's attention term drops from 6·4·16·8 to 6·4·16·3 per token, 8 tokens.
	if a-b != 8*6*4*16*(8-3) {
		t.Errorf("window saves %d, want %d", a-b, 8*6*4*16*5)
	}
}

func TestOverflowAndBadInput(t *testing.T) {
	c := handConfig()
	c.Vocab, c.Hidden, c.ExpertFFN = 1<<24, 1<<24, 1<<24
	if _, err := Ops(c, Shape{Seq: 1 << 24, Batch: 1 << 24}, acNone, ExactTile); !errors.Is(err, ErrOverflow) {
		t.Errorf("want ErrOverflow, got %v", err)
	}
	if _, err := Count(c, Shape{Seq: 1 << 24, Batch: 1 << 24}, acNone, ExactTile); !errors.Is(err, ErrOverflow) {
		t.Errorf("Count: want ErrOverflow, got %v", err)
	}
	for _, tc := range []struct {
		s    Shape
		tile Tile
		want string
	}{
		{Shape{Seq: 0, Batch: 1}, ExactTile, "seq = 0"},
		{Shape{Seq: 8, Batch: -1}, ExactTile, "batch = -1"},
		{Shape{Seq: 8, Batch: 1}, Tile{0, 128}, "attention tile = 0x128"},
	} {
		if _, err := Ops(handConfig(), tc.s, acNone, tc.tile); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want %q", tc.s, tc.tile, err, tc.want)
		}
	}
	bad := handConfig()
	bad.TopK = 9
	if _, err := Ops(bad, Shape{Seq: 8, Batch: 1}, acNone, ExactTile); err == nil || !strings.Contains(err.Error(), "top_k") {
		t.Errorf("invalid config: %v", err)
	}
}

// FuzzOpsInvariants: for random small configs and policies, model =
// 6 × Σ forward matmul counts; hardware ≥ model; hardware with no
// checkpointing and exact tiles adds exactly flash's n·d per layer.
func FuzzOpsInvariants(f *testing.F) {
	f.Add(uint8(8), uint8(2), uint8(1), uint8(3), uint8(0), uint8(4))
	f.Add(uint8(33), uint8(1), uint8(3), uint8(0), uint8(5), uint8(16))
	f.Fuzz(func(t *testing.T, seq, batch, mode, every, win, tile uint8) {
		c := handConfig()
		c.Window = []int{int(win) % 9, 0}
		c.SharedExperts, c.SharedFFN, c.SharedGated = int(every)%2, 8, every%4 == 1
		s := Shape{Seq: int(seq)%40 + 1, Batch: int(batch)%3 + 1}
		ac := []moe.AC{acNone, acSelective, acFull, {Mode: moe.ACLayer, Every: int(every)%3 + 1}}[mode%4]
		tl := Tile{int(tile)%16 + 1, int(tile)%7 + 1}
		recs, err := Ops(c, s, moe.AC{Mode: moe.ACNone}, ExactTile)
		if err != nil {
			t.Fatal(err)
		}
		model, _ := ModelPerStep(c, s)
		var fwd int64
		for _, r := range recs {
			if r.Op.Kind() != moe.KindElementwise && r.Pass == moe.Forward {
				fwd += r.Count
			}
		}
		if model != 6*fwd {
			t.Fatalf("model %d != 6·Σ forward %d", model, fwd)
		}
		hw, err := HardwarePerStep(c, s, ac, tl)
		if err != nil || hw < model {
			t.Fatalf("hardware %d < model %d (%v)", hw, model, err)
		}
		plain, _ := HardwarePerStep(c, s, acNone, ExactTile)
		var flash int64
		for l := 0; l < c.Layers; l++ {
			flash += int64(s.Batch*c.Heads*c.HeadDim) * AttentionEntries(s.Seq, c.Window[l], ExactTile)
		}
		if plain != model+2*flash {
			t.Fatalf("hardware(none) %d != model %d + 2·flash %d", plain, model, flash)
		}
	})
}

func TestParseConvention(t *testing.T) {
	for _, c := range AllConventions() {
		if got, err := ParseConvention(string(c)); err != nil || got != c || c.Explain() == "" {
			t.Errorf("%s: %v %v", c, got, err)
		}
	}
	if _, err := ParseConvention("6N"); err == nil || !strings.Contains(err.Error(), "torchtitan") {
		t.Errorf("unknown convention: %v", err)
	}
}

// TestMegatronBridgePublished checks the megatron convention against
// NVIDIA Megatron-Bridge's published pre-training table (docs/
// performance-summary.md, "25.09 NeMo Container"; BF16, columns "Tokens /
// sec / GPU" and "Model TFLOP / sec / GPU", the latter computed by
// Megatron's num_floating_point_operations): tokens/s × our FLOPs/token
// must match their TFLOP/s within the rounding of both columns.
func TestMegatronBridgePublished(t *testing.T) {
	for _, tc := range []struct {
		model  string
		seq    int
		system string
		tps    float64
		tflops float64
	}{
		{"qwen3-30b-a3b", 4096, "DGX-GB200", 22775, 524},
		{"qwen3-30b-a3b", 4096, "DGX-B200", 18066, 416},
		{"qwen3-30b-a3b", 4096, "DGX-H100", 10494, 241},
		{"qwen3-235b-a22b", 4096, "DGX-GB200", 4452, 659},
		{"qwen3-235b-a22b", 4096, "DGX-B200", 4104, 607},
		{"qwen3-235b-a22b", 4096, "DGX-H100", 1204, 178},
		{"llama3-8b", 8192, "DGX-GB200", 31357, 1614},
		{"llama3-8b", 8192, "DGX-B200", 29994, 1544},
		{"llama3-8b", 8192, "DGX-H100", 14079, 725},
	} {
		c, err := hf.Load(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		n, err := MegatronPerStep(c, Shape{Seq: tc.seq, Batch: 1}, 128)
		if err != nil {
			t.Fatal(err)
		}
		perToken := float64(n) / float64(tc.seq)
		got := perToken * tc.tps / 1e12
		// Both published columns are rounded to integers: ±0.5 TFLOP/s, and
		// ±0.5 tokens/s worth perToken/2 FLOP/s.
		if math.Abs(got-tc.tflops) > 0.5+0.5*perToken/1e12 {
			t.Errorf("%s on %s: %.2f TFLOP/s from our count, Megatron-Bridge publishes %.0f", tc.model, tc.system, got, tc.tflops)
		}
	}
}
