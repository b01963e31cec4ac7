package hw

import "fmt"

// ResolveError says which of Resolve's two names is wrong: Field is "gpu"
// or "cluster".
type ResolveError struct {
	Field string
	Err   error
}

func (e *ResolveError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }
func (e *ResolveError) Unwrap() error { return e.Err }

// Resolve is the one resolution of a run's hardware: the device gpu names
// ("" = DefaultDeviceName) and the cluster cluster names, a built-in name or
// a cluster JSON path ("" = the GPU's usual one, ClusterForGPU).
func Resolve(gpu, cluster string) (Device, *Cluster, error) {
	if gpu == "" {
		gpu = DefaultDeviceName
	}
	dev, err := LookupDevice(gpu)
	if err != nil {
		return dev, nil, &ResolveError{"gpu", err}
	}
	if cluster == "" {
		cluster = ClusterForGPU(dev.Name)
	}
	cl, err := LoadCluster(cluster)
	if err != nil {
		return dev, nil, &ResolveError{"cluster", err}
	}
	return dev, cl, nil
}
