package job

import (
	"fmt"
	"strings"
	"testing"
)

// TestPipelineStep: on a hand-written rank order holding two stages, with
// a zero-bubble stage whose weight passes complete its gradients, over two
// accumulation micro-steps: each stage is gathered at its first action of
// the step only; its first and last full backward or weight pass of each
// micro-step (of m = 2) start and reduce its gradients; input passes count
// for neither (PyTorch's backward_maybe_with_nosync counts full backwards
// and weight passes).
func TestPipelineStep(t *testing.T) {
	a := func(k PipeKind, s, m int) PipeAction { return PipeAction{Kind: k, Stage: s, Micro: m} }
	order := [][]PipeAction{{a(PipeF, 0, 0), a(PipeF, 2, 0), a(PipeF, 0, 1), a(PipeI, 2, 0), a(PipeF, 2, 1),
		a(PipeW, 2, 0), a(PipeB, 0, 0), a(PipeI, 2, 1), a(PipeW, 2, 1), a(PipeB, 0, 1)}}
	var b strings.Builder
	for _, st := range PipelineStep(order, 2, 2)[0] {
		fmt.Fprintf(&b, "%d:%s", st.Accum, st.PipeAction)
		for _, f := range []struct {
			on   bool
			name string
		}{{st.Gather, "g"}, {st.First, "f"}, {st.Reduce, "r"}} {
			if f.on {
				b.WriteString("+" + f.name)
			}
		}
		b.WriteString(" ")
	}
	want := "0:0F0+g 0:2F0+g 0:0F1 0:2I0 0:2F1 0:2W0+f 0:0B0+f 0:2I1 0:2W1+r 0:0B1+r " +
		"1:0F0 1:2F0 1:0F1 1:2I0 1:2F1 1:2W0+f 1:0B0+f 1:2I1 1:2W1+r 1:0B1+r "
	if got := b.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
