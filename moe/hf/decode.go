package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Decoding a config.json with errors that point into the file.

// jsonPosition turns a byte offset into a 1-based line and column.
func jsonPosition(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	if off < 0 {
		off = 0
	}
	before := data[:off]
	line = 1 + bytes.Count(before, []byte{'\n'})
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1)
	if col < 1 {
		col = 1
	}
	return line, col
}

// jsonKind names the JSON value a Go type decodes from, for errors that
// speak of the file rather than of Go.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

// decodeHF unmarshals data, turning JSON errors into ones that say where.
func decodeHF(data []byte) (*configJSON, error) {
	var h configJSON
	err := json.Unmarshal(data, &h)
	if err == nil {
		var keys map[string]json.RawMessage
		if json.Unmarshal(data, &keys) == nil {
			_, h.slidingWindowSet = keys["sliding_window"]
			_, h.qLoraRankSet = keys["q_lora_rank"]
			_, h.attnChunkSet = keys["attention_chunk_size"]
		}
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		return &h, nil
	case errors.As(err, &syn):
		line, col := jsonPosition(data, syn.Offset)
		return nil, fmt.Errorf("malformed JSON at line %d, column %d: %v", line, col, syn)
	case errors.As(err, &typ) && typ.Field == "":
		return nil, fmt.Errorf("a config.json must be a JSON object, found a JSON %s", typ.Value)
	case errors.As(err, &typ):
		line, col := jsonPosition(data, typ.Offset)
		return nil, fmt.Errorf("line %d, column %d: key %q holds a JSON %s, want %s", line, col, typ.Field, typ.Value, jsonKind(typ.Type))
	}
	return nil, fmt.Errorf("malformed JSON: %v", err)
}
