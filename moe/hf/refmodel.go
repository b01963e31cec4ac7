package hf

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref"
)

// ReferenceModel is cfg's float32 reference model (moe/ref) holding the
// checkpoint at path (LoadParams), refusing one with a non-finite weight
// (CheckFinite, naming it).
func ReferenceModel(path string, cfg *moe.Config) (*ref.Model[float32], error) {
	ps, err := LoadParams[float32](path, cfg)
	if err != nil {
		return nil, err
	}
	if err := CheckFinite(cfg, ps); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		return nil, err
	}
	return m, m.SetTensors(ps)
}
