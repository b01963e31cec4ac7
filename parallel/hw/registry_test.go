package hw

import (
	"strings"
	"testing"
)

// TestRegistryEntries: every listed device and cluster resolves whatever its
// case, and a name with a path separator never reaches the embedded files
// (it would otherwise name a file outside the folder asked for).
func TestRegistryEntries(t *testing.T) {
	for _, dir := range []string{"devices", "clusters"} {
		names := registryNames(dir)
		if len(names) == 0 {
			t.Fatalf("%s: empty", dir)
		}
		for _, n := range names {
			if _, ok := registryEntry(dir, strings.ToUpper(n)); !ok {
				t.Errorf("%s/%s: not found by its upper-case name", dir, n)
			}
		}
	}
	if _, ok := registryEntry("devices", "../clusters/hgx"); ok {
		t.Error("a path with a separator resolved")
	}
	if _, ok := registryEntry("devices", "hgx"); ok {
		t.Error("a cluster name resolved as a device")
	}
}

func TestDecodeStrict(t *testing.T) {
	var v struct {
		A int `json:"a"`
	}
	for in, want := range map[string]string{
		`{"a":1}`:         "",
		`{"a":1} {"a":2}`: "data after",
		`{"b":1}`:         `unknown field "b"`,
	} {
		err := decodeStrict([]byte(in), &v)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}
