package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/moescope/moescope/internal/jsonout"
)

// writeJSON prints v as one indented JSON document, the --json output of
// command. It marshals before writing anything: a value JSON cannot hold
// (NaN, ±Inf) is an error that names the command and the field, found
// before a byte is printed, never half a document or "json: unsupported
// value: +Inf".
func writeJSON(w io.Writer, command string, v any) error { return writeJSONIndent(w, command, v, "  ") }

// writeJSONLine is writeJSON on one line.
func writeJSONLine(w io.Writer, command string, v any) error {
	return writeJSONIndent(w, command, v, "")
}

func writeJSONIndent(w io.Writer, command string, v any, indent string) error {
	b, err := marshalJSON(command, v, indent)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// marshalJSON is jsonout.Marshal (indented by indent when not empty, with a
// final newline) with its error naming the command; a non-finite number is
// one naming its field.
func marshalJSON(command string, v any, indent string) ([]byte, error) {
	b, err := jsonout.Marshal(v, indent)
	var nf *jsonout.NonFiniteError
	switch {
	case errors.As(err, &nf):
		return nil, fmt.Errorf("%s: JSON output: %v (an input outside what the model can represent); nothing printed", command, err)
	case err != nil:
		return nil, fmt.Errorf("%s: JSON output: %w; nothing printed", command, err)
	}
	return b, nil
}
