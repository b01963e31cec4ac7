package epbuffer

import (
	"strings"
	"testing"
)

// TestDeepEPBytes: the Buffer of DeepEP's README get_buffer, derived by
// hand from csrc/config.hpp at 92fe2de (and checked against a literal
// Python transcription of its two size hints):
//
//   - ep 8, hidden 7168 (DeepSeek-V3): both configs of 8 ranks queue 256
//     tokens over 10 channels (20 SMs / 2) and 8 peers, 1 RDMA rank:
//     10·8·(2+3)·4 = 1,600 bytes of heads, and 10·8·256 = 20,480 tokens of
//     14,336 + 8 + 128·8 + 128·4 + 128·4 = 16,392 bytes = 335,708,160;
//     together 335,709,760, aligned up to 128: 335,709,824. No RDMA buffer
//     within 8 ranks; plus the 32 MiB workspace: 369,264,256.
//   - ep 16, hidden 2048: NVLink queues of 288 tokens, 2 RDMA ranks:
//     10·8·(4+3)·4 = 2,240 + 10·8·288 = 23,040 tokens of 4,096 + 8 +
//     1,024 + 512 + 512 = 6,152 bytes (141,742,080) = 141,744,320,
//     aligned 141,744,384;
//     RDMA: the dispatch config's receive queue, 128 aligned up to its send
//     chunk 20, 140 tokens (combine's: 132), 10·2·18·2·4 = 2,880 bytes of
//     heads and 2·10·2·140 = 5,600 token slots of 4,096 + 8 + 1,024 + 512 +
//     512 + 16 = 6,168 bytes (34,540,800) = 34,543,680, aligned 34,543,744;
//     with the workspace 209,842,560.
func TestDeepEPBytes(t *testing.T) {
	for _, c := range []struct {
		hidden, ranks int
		want          int64
	}{{7168, 8, 369264256}, {2048, 16, 209842560}} {
		got, err := DeepEPBytes(c.hidden, c.ranks)
		if err != nil || got != c.want {
			t.Errorf("DeepEPBytes(%d, %d) = %d, %v; want %d", c.hidden, c.ranks, got, err, c.want)
		}
	}
	if _, err := DeepEPBytes(7168, 12); err == nil || !strings.Contains(err.Error(), "ep = 12") {
		t.Errorf("ep 12 (no recommended config): %v", err)
	}
}
