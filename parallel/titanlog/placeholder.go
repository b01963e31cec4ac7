package titanlog

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/moescope/moescope/parallel/plan"
)

// placeholderIn returns the dotted key and value of the first string in
// cfg (keys in sorted order, tables and lists walked) that is still an
// export's plan.Placeholder: a run that printed one did not read a
// filled-in job config.
func placeholderIn(prefix string, cfg map[string]any) (key, value string, ok bool) {
	for _, k := range slices.Sorted(maps.Keys(cfg)) {
		if key, value, ok = placeholderValue(prefix+k, cfg[k]); ok {
			return key, value, true
		}
	}
	return "", "", false
}

func placeholderValue(key string, x any) (string, string, bool) {
	switch v := x.(type) {
	case string:
		return key, v, strings.HasPrefix(v, plan.Placeholder)
	case map[string]any:
		return placeholderIn(key+".", v)
	case []any:
		for i, e := range v {
			if k, s, ok := placeholderValue(fmt.Sprintf("%s[%d]", key, i), e); ok {
				return k, s, true
			}
		}
	}
	return "", "", false
}
