package main

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
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

// marshalJSON is json.Marshal (indented by indent when not empty) with a
// final newline, as json.Encoder writes it; a non-finite number is an
// error naming its field (nonFinite).
func marshalJSON(command string, v any, indent string) ([]byte, error) {
	var b []byte
	var err error
	if indent != "" {
		b, err = json.MarshalIndent(v, "", indent)
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		var uv *json.UnsupportedValueError
		if errors.As(err, &uv) {
			if path, x, ok := nonFinite(reflect.ValueOf(v), ""); ok {
				return nil, fmt.Errorf("%s: JSON output: %s = %v is not a finite number (an input outside what the model can represent); nothing printed", command, path, x)
			}
		}
		return nil, fmt.Errorf("%s: JSON output: %w; nothing printed", command, err)
	}
	return append(b, '\n'), nil
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// nonFinite finds the first NaN or ±Inf float in v in the order JSON
// writes it and returns its path in JSON names (breakdown.exposed_comm_s.
// all_gather, layers[3].flops); ok is false when there is none outside
// values that marshal themselves.
func nonFinite(v reflect.Value, path string) (string, float64, bool) {
	if !v.IsValid() {
		return "", 0, false
	}
	if t := v.Type(); t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface &&
		(t.Implements(jsonMarshaler) || t.Implements(textMarshaler)) {
		return "", 0, false
	}
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		if x := v.Float(); math.IsNaN(x) || math.IsInf(x, 0) {
			return path, x, true
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nonFinite(v.Elem(), path)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if p, x, ok := nonFinite(v.Index(i), path+"["+strconv.Itoa(i)+"]"); ok {
				return p, x, true
			}
		}
	case reflect.Map:
		keys := v.MapKeys()
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = mapKey(k)
		}
		idx := make([]int, len(keys))
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(a, b int) bool { return names[idx[a]] < names[idx[b]] })
		for _, i := range idx {
			if p, x, ok := nonFinite(v.MapIndex(keys[i]), joinPath(path, names[i])); ok {
				return p, x, true
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if tag == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			p := joinPath(path, name)
			switch {
			case f.Anonymous && name == "":
				p = path // an embedded struct's fields are the outer object's
			case name == "":
				p = joinPath(path, f.Name)
			}
			if p, x, ok := nonFinite(v.Field(i), p); ok {
				return p, x, true
			}
		}
	}
	return "", 0, false
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// mapKey is a map key as JSON writes it (enough to name a field).
func mapKey(k reflect.Value) string {
	switch {
	case k.Kind() == reflect.String:
		return k.String()
	case k.CanInt():
		return strconv.FormatInt(k.Int(), 10)
	case k.CanUint():
		return strconv.FormatUint(k.Uint(), 10)
	case k.CanInterface():
		return fmt.Sprint(k.Interface())
	}
	return "?"
}
