package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/moescope/moescope/internal/fileio"
)

// maxTokensBytes bounds a tokens file read into memory.
const maxTokensBytes = 1 << 30

// ReadTokens reads a tokens file: a JSON array of equal-length sequences
// of token ids in [0, vocab), the input_ids of a batch for HF's training
// loss (the labels are the next tokens), as testdata/torchref's reference
// writes them (tokens.json). Each sequence needs at least two tokens (one
// predicted position). Errors name the sequence and the position.
func ReadTokens(path string, vocab int) ([][]int, error) {
	b, err := fileio.ReadBounded(path, maxTokensBytes)
	if err != nil {
		return nil, err
	}
	toks, err := parseTokens(b, vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return toks, nil
}

// parseTokens is ReadTokens on the file's bytes.
func parseTokens(b []byte, vocab int) ([][]int, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	var raw [][]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var typ *json.UnmarshalTypeError
		switch {
		case errors.Is(err, io.EOF):
			err = errors.New("the file is empty")
		case errors.As(err, &typ):
			err = fmt.Errorf("found a JSON %s at byte %d", typ.Value, typ.Offset)
		}
		return nil, fmt.Errorf("want a JSON array of arrays of token ids: %w", err)
	}
	if dec.More() {
		return nil, errors.New("trailing data after the token array")
	}
	if len(raw) == 0 {
		return nil, errors.New("no sequences")
	}
	out := make([][]int, len(raw))
	for i, seq := range raw {
		if len(seq) != len(raw[0]) {
			return nil, fmt.Errorf("sequence %d has %d tokens but sequence 0 has %d: sequences must have equal length", i, len(seq), len(raw[0]))
		}
		if len(seq) < 2 {
			return nil, fmt.Errorf("sequence %d has %d tokens: need at least 2 (the labels are the next tokens)", i, len(seq))
		}
		out[i] = make([]int, len(seq))
		for j, n := range seq {
			v, err := strconv.ParseInt(string(n), 10, 64)
			if err != nil || v < 0 || v >= int64(vocab) {
				return nil, fmt.Errorf("sequence %d, position %d: token id %s is not an integer in [0, vocab_size = %d)", i, j, n, vocab)
			}
			out[i][j] = int(v)
		}
	}
	return out, nil
}
