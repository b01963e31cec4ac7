package memory

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// TestLoadSavedPerLayer: the step builder's per-unit tables, which copy
// one block of each kind (MoE or dense, fully checkpointed or not) to the
// others, equal Saved called on every layer, for random configs of every
// model type, every policy, with ep, tp and compile.
func TestLoadSavedPerLayer(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 20))
	for n := 0; n < 60; n++ {
		cfg := moetest.Config(r)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, ac := range moetest.Policies() {
			ep := 1
			if cfg.IsMoE() && r.IntN(2) == 0 {
				ep = 2
			}
			sh := Shape{Batch: 1 + r.IntN(3), Seq: 2 * (1 + r.IntN(4)), AC: ac, Attention: []Attention{Flash, Eager}[r.IntN(2)], EP: ep,
				Act: moe.BF16, Compile: Compile{Model: r.IntN(2) == 0}}
			if ac.Mode == moe.ACMemoryBudget { // needs the compiled model; eager attention is refused
				sh.Attention, sh.Compile.Model = Flash, true
			}
			var units []Unit
			units = append(units, Unit{Layer: moe.LayerEmbed})
			for l := range cfg.Layers {
				units = append(units, Unit{Layer: l})
			}
			units = append(units, Unit{Layer: cfg.LayerHead()})
			o, err := Options{AC: ac, Compile: sh.Compile}.normalized()
			if err != nil {
				t.Fatal(err)
			}
			s := &stepBuilder{cfg: cfg, o: o, sh: sh, units: units, last: len(units) - 1}
			if _, err := s.loadSaved(); err != nil {
				t.Fatal(err)
			}
			none := sh
			none.AC = moe.AC{Mode: moe.ACNone}
			for i, u := range units[:len(units)-1] { // the head's are split by loadSaved
				want, err := Saved(cfg, u.Layer, sh)
				if err != nil {
					t.Fatal(err)
				}
				wantNone, err := Saved(cfg, u.Layer, none)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(s.saved[i], want) || !reflect.DeepEqual(s.none[i], wantNone) {
					t.Fatalf("%s ac %s layer %d: builder's saved %v none %v, Saved %v %v", cfg.Name, ac, u.Layer, s.saved[i], s.none[i], want, wantNone)
				}
			}
		}
	}
}
