package hw

import (
	"errors"
	"testing"
)

// TestResolve: the defaults DESIGN's Hardware contract states (b200 in the
// hgx cluster; a Hopper part in its HGX H100 host) and an error naming the
// wrong one of the two names.
func TestResolve(t *testing.T) {
	for _, c := range []struct{ gpu, cluster, wantGPU, wantCluster string }{
		{"", "", "b200", "hgx"},
		{"h100", "", "h100", "hgx-h100"},
		{"h200", "hgx", "h200", "hgx"},
	} {
		dev, cl, err := Resolve(c.gpu, c.cluster)
		if err != nil || dev.Name != c.wantGPU || cl.Name != c.wantCluster {
			t.Errorf("Resolve(%q, %q) = %s, %v, %v; want %s, %s", c.gpu, c.cluster, dev.Name, cl, err, c.wantGPU, c.wantCluster)
		}
	}
	for _, c := range []struct{ gpu, cluster, field string }{{"a100", "", "gpu"}, {"b200", "no-such-cluster", "cluster"}} {
		_, _, err := Resolve(c.gpu, c.cluster)
		var re *ResolveError
		if !errors.As(err, &re) || re.Field != c.field {
			t.Errorf("Resolve(%q, %q): %v, want an error naming %s", c.gpu, c.cluster, err, c.field)
		}
	}
}
