package hf

import (
	"strings"
	"testing"
)

// TestParseTokens: the sequences of a good file, and each malformed file
// refused naming what is wrong.
func TestParseTokens(t *testing.T) {
	got, err := parseTokens([]byte(" [[1, 2, 3], [0, 23, 5]] "), 24)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1][1] != 23 {
		t.Errorf("got %v", got)
	}
	for _, c := range []struct{ in, want string }{
		{`[[1,2,3],[1,2]]`, "sequence 1 has 2 tokens but sequence 0 has 3"},
		{`[[1,2],[1,24]]`, "sequence 1, position 1: token id 24 is not an integer in [0, vocab_size = 24)"},
		{`[[1,-1]]`, "token id -1"},
		{`[[1,2.5]]`, "token id 2.5"},
		{`[[1,1e30]]`, "token id 1e30"},
		{`[[1]]`, "need at least 2"},
		{`[]`, "no sequences"},
		{`[[1,2]] [[3,4]]`, "trailing data"},
		{`{"a":1}`, "JSON array of arrays of token ids: found a JSON object at byte 1"},
		{`[1,2]`, "found a JSON number at byte 2"},
		{``, "the file is empty"},
		{`[["1",2]]`, `token id "1" is not an integer`},
	} {
		_, err := parseTokens([]byte(c.in), 24)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.in, err, c.want)
		}
	}
}

// FuzzParseTokens: whatever it accepts is a non-empty batch of
// equal-length sequences of at least two ids in [0, vocab).
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{`[[1,2,3],[4,5,6]]`, `[[1,2],[3]]`, `[[0,23]]`, `[[1e3,2]]`, `[[-0,1]]`, `[[9223372036854775808,1]]`, `[]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		const vocab = 24
		toks, err := parseTokens(b, vocab)
		if err != nil {
			return
		}
		if len(toks) == 0 || len(toks[0]) < 2 {
			t.Fatalf("accepted %q: %v", b, toks)
		}
		for _, s := range toks {
			if len(s) != len(toks[0]) {
				t.Fatalf("accepted ragged %q", b)
			}
			for _, id := range s {
				if id < 0 || id >= vocab {
					t.Fatalf("accepted id %d from %q", id, b)
				}
			}
		}
	})
}
