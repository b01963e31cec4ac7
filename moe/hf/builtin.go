package hf

import (
	"embed"
	"sort"
	"strings"
)

// The built-in models are Hugging Face config.json files in models/, each
// with a "_source" key naming the repository and revision its numbers come
// from. The file name without ".json" is the model's name.
//
//go:embed models/*.json
var builtinFS embed.FS

// Builtins lists the built-in model names, sorted.
func Builtins() []string {
	entries, err := builtinFS.ReadDir("models")
	if err != nil {
		panic("moe: embedded models missing: " + err.Error())
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// builtinJSON returns the config.json of a built-in model.
func builtinJSON(name string) ([]byte, bool) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return nil, false
	}
	data, err := builtinFS.ReadFile("models/" + name + ".json")
	return data, err == nil
}
