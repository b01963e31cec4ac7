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

// fmtInt writes n with thousands separators: 30,532,122,624.
func fmtInt(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtBillions writes n as 30.53B.
func fmtBillions(n int64) string { return fmt.Sprintf("%.2fB", float64(n)/1e9) }
