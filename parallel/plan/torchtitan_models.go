package plan

import (
	"fmt"
	"sort"
	"strings"
)

// TorchtitanModelFor returns the built-in moescope model that a v0.2.2 job
// config's [model] name and flavor select (the inverse of the TOML export's
// mapping), or an error listing those moescope knows.
func TorchtitanModelFor(name, flavor string) (string, error) {
	var known []string
	for m, t := range torchtitanModel {
		if t.name == name && t.flavor == flavor {
			return m, nil
		}
		known = append(known, fmt.Sprintf("%s %s", t.name, t.flavor))
	}
	sort.Strings(known)
	return "", fmt.Errorf("model.name = %q, model.flavor = %q: no moescope model for it (known: %s)", name, flavor, strings.Join(known, ", "))
}

// TorchtitanRegistryModel returns the built-in moescope model whose
// config-registry function (current torchtitan) is fn, or an error listing
// those moescope knows.
func TorchtitanRegistryModel(fn string) (string, error) {
	var known []string
	for m, t := range torchtitanModel {
		if t.registryFunc == "" {
			continue
		}
		if t.registryFunc == fn {
			return m, nil
		}
		known = append(known, t.registryFunc)
	}
	sort.Strings(known)
	return "", fmt.Errorf("config = %s(): no moescope model for this registry function (known: %s)", fn, strings.Join(known, ", "))
}

// TorchtitanRegistryArgs returns the arguments the registry function of
// moescope model m passes its package's model_registry (what the Python
// export writes before converters=converters), or "" when torchtitan main
// has no registry function for m.
func TorchtitanRegistryArgs(m string) string { return torchtitanModel[m].registryArgs }
