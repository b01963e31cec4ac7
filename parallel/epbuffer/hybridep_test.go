package epbuffer

import "testing"

// TestHybridEPBytes: the NVLink buffers by hand (intranode.cu at 94a9f8f).
//
//   - Qwen3-30B-A3B on 8 GPUs, ep 8: hidden 2048, 128 experts (16 local),
//     lbs 2 × seq 4096 = 8,192 tokens (a multiple of 64): maxT = 65,536;
//     tokens 65,536·2048·2 = 268,435,456; probs 65,536·16·8·4 =
//     33,554,432; scales 65,536·16·4 = 4,194,304: 306,184,192.
//   - 100 tokens pad to 128; ep 16 over domains of 8: maxT = 2,048; hidden
//     256, 2 local experts: 2,048·256·2 = 1,048,576, 2,048·2·8·4 = 131,072,
//     2,048·2·4 = 16,384: 1,196,032.
func TestHybridEPBytes(t *testing.T) {
	for _, c := range []struct {
		hidden, tokens, local, ep, domain int
		want                              int64
	}{
		{2048, 8192, 16, 8, 8, 306184192},
		{256, 100, 2, 16, 8, 1196032},
	} {
		got, err := HybridEPBytes(c.hidden, c.tokens, c.local, c.ep, c.domain)
		if err != nil || got != c.want {
			t.Errorf("HybridEPBytes(%d, %d, %d, %d, %d) = %d, %v; want %d", c.hidden, c.tokens, c.local, c.ep, c.domain, got, err, c.want)
		}
	}
	if _, err := HybridEPBytes(2048, 0, 16, 8, 8); err == nil {
		t.Error("tokens 0 accepted")
	}
}
