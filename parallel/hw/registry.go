package hw

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// The registry: one JSON document per device in devices/ and per cluster in
// clusters/, each number with its source beside it, embedded so that the
// binary needs no data files.
//
//go:embed devices/*.json clusters/*.json
var registry embed.FS

// registryNames lists the entries of one registry folder, sorted.
func registryNames(dir string) []string {
	ents, err := registry.ReadDir(dir)
	if err != nil {
		panic("hw: embedded " + dir + " unreadable: " + err.Error())
	}
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// registryEntry returns the JSON of one entry, its name taken
// case-insensitively; ok is false for a name the folder does not hold
// (including anything with a path separator).
func registryEntry(dir, name string) (data []byte, ok bool) {
	key := strings.ToLower(name)
	if strings.ContainsAny(key, `/\`) {
		return nil, false
	}
	data, err := registry.ReadFile(dir + "/" + key + ".json")
	return data, err == nil
}

// decodeStrict decodes exactly one JSON object into v: an unknown field (a
// misspelt one would otherwise silently keep a zero) or data after the object
// is an error.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the JSON object")
	}
	return nil
}

// missingFields reports the fields of the struct v points to that data
// (one JSON object, already decoded into v) leaves out or gives as null,
// among those whose JSON tag lacks omitempty (requiredFields): either would
// silently keep a zero (a missing base_latency_us made every collective
// free of latency).
func missingFields(data []byte, v any) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return err
	}
	var errs []error
	for _, name := range requiredFields(reflect.TypeOf(v).Elem()) {
		if raw, ok := keys[name]; !ok || string(bytes.TrimSpace(raw)) == "null" {
			errs = append(errs, fmt.Errorf("%s: required, missing or null", name))
		}
	}
	return errors.Join(errs...)
}
