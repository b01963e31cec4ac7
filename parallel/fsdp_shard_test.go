package parallel

import (
	"reflect"
	"testing"
)

func TestFSDPShardPadding(t *testing.T) {
	// A [5, 3] weight over 2 ranks: chunks of ⌈5/2⌉ = 3 rows, rank 1 holds
	// rows 3, 4 and a zero row; S = 2·3·3 = 18 elements (FSDP2 pads dim 0).
	s := FSDPShard{Outer: 1, Rows: 5, Inner: 3, N: 2}
	full := make([]float32, 15)
	for i := range full {
		full[i] = float32(i + 1)
	}
	if s.Chunk() != 3 || s.ShardElements() != 9 || s.PaddedElements() != 18 || s.Elements() != 15 {
		t.Fatalf("sizes %d %d %d %d, want 3 9 18 15", s.Chunk(), s.ShardElements(), s.PaddedElements(), s.Elements())
	}
	if got, want := s.Shard(full, 1), []float32{10, 11, 12, 13, 14, 15, 0, 0, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("shard 1 = %v, want %v", got, want)
	}
	// Dim-1 sharding of 2 stacked experts [2, 3, 2] over 2 ranks: rank 0
	// holds rows 0–1 of each expert, rank 1 row 2 and a zero row.
	e := FSDPShard{Outer: 2, Rows: 3, Inner: 2, N: 2}
	st := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if got, want := e.Shard(st, 1), []float32{5, 6, 0, 0, 11, 12, 0, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("dim-1 shard 1 = %v, want %v", got, want)
	}
}

// FuzzFSDPShardRoundTrip: Unshard(Pad(x)) = x for any geometry.
func FuzzFSDPShardRoundTrip(f *testing.F) {
	f.Add(uint8(1), uint8(5), uint8(3), uint8(2))
	f.Add(uint8(3), uint8(1), uint8(1), uint8(4))
	f.Add(uint8(2), uint8(7), uint8(2), uint8(7))
	f.Fuzz(func(t *testing.T, o, r, i, n uint8) {
		s := FSDPShard{Outer: int(o%4) + 1, Rows: int(r%9) + 1, Inner: int(i%4) + 1, N: int(n%8) + 1}
		full := make([]float32, s.Elements())
		for k := range full {
			full[k] = float32(k + 1)
		}
		padded := s.Pad(full)
		if int64(len(padded)) != s.PaddedElements() {
			t.Fatalf("%+v: padded %d elements, want %d", s, len(padded), s.PaddedElements())
		}
		back := make([]float32, len(full))
		s.Unshard(padded, back)
		if !reflect.DeepEqual(back, full) {
			t.Errorf("%+v: round trip changed the tensor", s)
		}
	})
}
