package kernel

import "testing"

func TestMeasurePeak(t *testing.T) {
	for _, name := range KernelNames() {
		restore, _ := UseKernel(name)
		p := MeasurePeak(2)
		restore()
		t.Logf("%+v", p)
		if p.PerCoreGFLOPS <= 0 || p.AllCoreGFLOPS <= 0 || p.Kernel != name || p.Threads != 2 {
			t.Errorf("%s: implausible peak %+v", name, p)
		}
	}
	t.Logf("%+v", Info())
}
