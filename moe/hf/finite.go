package hf

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// LoadFiniteParams is LoadParams refusing a checkpoint with a non-finite
// weight (CheckFinite, naming it, after the path).
func LoadFiniteParams[T float32 | float64](path string, cfg *moe.Config) ([][]T, error) {
	ps, err := LoadParams[T](path, cfg)
	if err != nil {
		return nil, err
	}
	if err := CheckFinite(cfg, ps); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}
