package main

import (
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// loadModel resolves a --model value: a built-in name or a config.json path.
// An empty value is a usage error listing the built-ins.
func loadModel(nameOrPath string) (*moe.Config, error) {
	if nameOrPath == "" {
		return nil, fmt.Errorf("%w: --model is required (a config.json path or one of: %s)", errUsage, strings.Join(hf.Builtins(), ", "))
	}
	cfg, err := hf.Load(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	return cfg, nil
}
