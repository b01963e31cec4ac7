package plan

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
)

// TestSettingChoices: two precisions, compile and the dispatcher make
// 2 × 2 × 3 = 12 choices, in the order the flags list them, each labelled
// by its values and resolved; the dispatcher is refused on a dense model,
// and an unknown or repeated name is refused naming it.
func TestSettingChoices(t *testing.T) {
	bf16, mx := job.DefaultRecipe(), job.DefaultRecipe()
	mx.Precision = job.MXFP8
	cs, err := SettingChoices([]job.Recipe{bf16, mx}, []string{"compile", "dispatcher"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 12 {
		t.Fatalf("%d choices, want 12", len(cs))
	}
	if cs[0].Label != "--precision bf16, --compile, --dispatcher all_to_all" ||
		cs[5].Label != "--precision bf16, --compile=false, --dispatcher hybridep" ||
		cs[11].Label != "--precision mxfp8, --compile=false, --dispatcher hybridep" {
		t.Errorf("labels %q, %q, %q", cs[0].Label, cs[5].Label, cs[11].Label)
	}
	if r := cs[5].Recipe; r.Compile || r.Dispatcher != job.HybridEP || r.Precision != job.BF16 || r.ReduceDType == "" {
		t.Errorf("choice 5's recipe %+v", r)
	}
	for _, c := range []struct {
		names []string
		moe   bool
		want  string
	}{
		{[]string{"dispatcher"}, false, "MoE models only"},
		{[]string{"colour"}, true, `"colour" is not a setting`},
		{[]string{"compile", "compile"}, true, "compile listed twice"},
	} {
		if _, err := SettingChoices([]job.Recipe{bf16}, c.names, c.moe); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.names, err, c.want)
		}
	}
}
