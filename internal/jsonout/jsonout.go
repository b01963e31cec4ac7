// Package jsonout marshals the JSON documents moescope's commands print
// and write so that a value JSON cannot hold never costs half a document:
// Marshal finds a NaN or ±Inf before a byte is written and names its field
// by its JSON path (breakdown.exposed_comm_s.all_gather, layers[3].flops),
// where encoding/json says only "json: unsupported value: +Inf".
//
// It imports nothing of moescope; everything else may import it.
package jsonout

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// NonFiniteError is a NaN or ±Inf float in a value to marshal.
type NonFiniteError struct {
	Path  string  // the field's JSON path: breakdown.exposed_comm_s.all_gather, layers[3].flops
	Value float64 // NaN, +Inf or -Inf
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("%s = %v is not a finite number", e.Path, e.Value)
}

// Marshal is json.Marshal (json.MarshalIndent by indent when indent is not
// empty) with a final newline, as json.Encoder writes it. A NaN or ±Inf is
// a *NonFiniteError naming the first such field in the order JSON writes
// it, outside values that marshal themselves; any other error is
// encoding/json's.
func Marshal(v any, indent string) ([]byte, error) {
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
				return nil, &NonFiniteError{Path: path, Value: x}
			}
		}
		return nil, err
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
