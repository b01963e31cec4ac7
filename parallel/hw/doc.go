// Package hw is the registry of hardware moescope models: devices (BF16 and
// FP8 dense peaks, memory as PyTorch reports it, SMs, HBM bandwidth, launch
// overhead) and clusters (hosts, NVLink domains, NICs and their
// efficiencies). Both are embedded JSON documents with a source beside every
// number, read by one loader; --cluster FILE.json reads the same schema.
//
// It imports only internal/fileio; parallel and everything that needs a
// device or a cluster import it.
package hw
