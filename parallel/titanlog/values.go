package titanlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
)

// values is a job config flattened to "section.key" → value, with the
// errors found reading it (every one is reported, not only the first).
type values struct {
	where string
	m     map[string]any
	errs  []error
}

func (v *values) fail(key string, val any, allowed string) {
	v.errs = append(v.errs, moe.FieldError{Field: key, Value: val, Allowed: allowed})
}

func (v *values) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w", v.where, errors.Join(v.errs...))
}

// int reads an integer (TOML int64, JSON number, Python literal).
func (v *values) int(key string, def int) int {
	x, ok := v.m[key]
	if !ok {
		return def
	}
	switch n := x.(type) {
	case int64:
		if n >= math.MinInt32 && n <= math.MaxInt32 {
			return int(n)
		}
	case float64:
		if n == math.Trunc(n) && math.Abs(n) <= math.MaxInt32 {
			return int(n)
		}
	}
	v.fail(key, x, "an integer")
	return def
}

func (v *values) str(key, def string) string {
	x, ok := v.m[key]
	if !ok {
		return def
	}
	s, ok := x.(string)
	if !ok {
		v.fail(key, x, "a string")
		return def
	}
	return s
}

func (v *values) bool(key string, def bool) bool {
	x, ok := v.m[key]
	if !ok {
		return def
	}
	b, ok := x.(bool)
	if !ok {
		v.fail(key, x, "true or false")
		return def
	}
	return b
}

// list reads a list of strings (absent: empty).
func (v *values) list(key string) []string {
	x, ok := v.m[key]
	if !ok || x == nil {
		return nil
	}
	var out []string
	switch l := x.(type) {
	case []string:
		return l
	case []any:
		for _, e := range l {
			s, ok := e.(string)
			if !ok {
				v.fail(key, x, "a list of strings")
				return nil
			}
			out = append(out, s)
		}
		return out
	}
	v.fail(key, x, "a list of strings")
	return nil
}

// parseJSONConfig reads a config saved or printed as JSON.
func parseJSONConfig(where string, data []byte) (*Job, error) {
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", where, err)
	}
	j, err := fromSections(where, doc)
	if err == nil {
		err = j.noACClass()
	}
	return j, err
}
