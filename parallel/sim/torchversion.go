package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// TorchVersion is the PyTorch release a run uses, as MAJOR.MINOR; the
// zero value is a release recent enough for every kernel the time model
// knows (2.9 or later).
type TorchVersion struct{ Major, Minor int }

// fusedNormSince is the first release whose eager RMSNorm is one fused
// kernel each way (aten._fused_rms_norm, pytorch/pytorch PR #153666, in
// nightlies from August 2025 per pytorch issue #157345, first released in
// 2.9.0); earlier releases run the composite of package cost's eagerBytes.
var fusedNormSince = TorchVersion{2, 9}

// ParseTorchVersion reads "MAJOR.MINOR" with an optional tail of a patch
// level or local build ("2.6", "2.9.0", "2.10.0.dev20250916+cu130"); ""
// is the zero value. field names the flag or key in errors.
func ParseTorchVersion(field, s string) (TorchVersion, error) {
	if s == "" {
		return TorchVersion{}, nil
	}
	parts := strings.SplitN(s, ".", 3)
	bad := fmt.Errorf("%s = %q: must be a PyTorch release MAJOR.MINOR (e.g. 2.6 or 2.9.0), major in [1, 9], minor in [0, 99]", field, s)
	if len(parts) < 2 {
		return TorchVersion{}, bad
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 1 || major > 9 || minor < 0 || minor > 99 {
		return TorchVersion{}, bad
	}
	return TorchVersion{major, minor}, nil
}

// before reports whether v is a stated release older than w (the zero
// value is never older).
func (v TorchVersion) before(w TorchVersion) bool {
	if v == (TorchVersion{}) {
		return false
	}
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}

func (v TorchVersion) String() string {
	if v == (TorchVersion{}) {
		return ""
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}
