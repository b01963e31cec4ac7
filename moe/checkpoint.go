package moe

import (
	"fmt"
	"strconv"
	"strings"
)

// ACMode is an activation-checkpointing mode.
type ACMode string

// Checkpointing modes, with torchtitan's semantics.
const (
	ACNone ACMode = "none"
	// ACSelective is torchtitan's per-op policy: outputs of mm/linear are
	// saved except every second one counted over the block's mm/linear calls;
	// the router-gate mm is never saved and does not advance the count;
	// attention outputs, router top-k values and indices and communication
	// outputs are saved; grouped expert GEMMs are not in the save list.
	ACSelective ACMode = "selective"
	// ACFull keeps only each block's input and recomputes the block in backward.
	ACFull ACMode = "full"
	// ACLayer fully checkpoints blocks i with (i+1) mod Every == 0.
	ACLayer ACMode = "layer"
)

// AC is a checkpointing policy.
type AC struct {
	Mode  ACMode
	Every int // N of layer:N
}

// ParseAC reads none|selective|full|layer:N.
func ParseAC(s string) (AC, error) {
	switch ACMode(s) {
	case ACNone, ACSelective, ACFull:
		return AC{Mode: ACMode(s)}, nil
	}
	if rest, ok := strings.CutPrefix(s, "layer:"); ok {
		n, err := strconv.Atoi(rest)
		if err == nil && n >= 1 {
			return AC{Mode: ACLayer, Every: n}, nil
		}
		return AC{}, fmt.Errorf("ac = %q: layer:N needs an integer N ≥ 1", s)
	}
	return AC{}, fmt.Errorf("ac = %q: must be none, selective, full or layer:N", s)
}

func (a AC) String() string {
	if a.Mode == ACLayer {
		return fmt.Sprintf("layer:%d", a.Every)
	}
	return string(a.Mode)
}

// MarshalText writes the policy as ParseAC reads it.
func (a AC) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads the policy with ParseAC.
func (a *AC) UnmarshalText(b []byte) error {
	p, err := ParseAC(string(b))
	*a = p
	return err
}

// FullyCheckpointed reports whether block i is wrapped whole (only its input kept).
func (a AC) FullyCheckpointed(i int) bool {
	switch a.Mode {
	case ACFull:
		return true
	case ACLayer:
		return (i+1)%a.Every == 0
	}
	return false
}
