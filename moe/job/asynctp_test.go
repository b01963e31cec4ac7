package job

import "testing"

// TestLayoutAsyncTPWithPP: async TP inside pipeline stages resolves under
// every schedule built, as torchtitan's pipeline_llm applies async TP to
// each stage's model chunk (v0.2.2 73a0e6979dd1 and main b5bcd76c66d0,
// torchtitan/distributed/pipeline_parallel.py); the flag is kept, and the
// stage layout carries it to the stage's tp group.
func TestLayoutAsyncTPWithPP(t *testing.T) {
	for _, sch := range PPSchedules() {
		l := Layout{GPUs: 8, PP: 2, TP: 2, AsyncTP: true, PPSchedule: sch}
		if err := l.Resolve(); err != nil {
			t.Errorf("%s: %v; want async TP accepted with pp 2 × tp 2", sch, err)
			continue
		}
		if !l.AsyncTP || !l.StageLayout().AsyncTP || l.StageLayout().TPDegree() != 2 {
			t.Errorf("%s: resolved %+v, stage %+v; want async TP on the stage's tp 2", sch, l, l.StageLayout())
		}
	}
}
