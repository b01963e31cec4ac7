package validate

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/moescope/moescope/parallel/sim/published"
)

// Pair is two published runs of one source that differ in settings of the
// stack only (the recipe, async TP, the precision's spelling): the same
// model, hardware, layout, batch and checkpointing. The ratio of their TPS
// is what turning those settings buys; the model is judged on that ratio,
// which a constant error of its own cancels out of.
type Pair struct {
	A         string  `json:"a"` // run names (TPSRow.Name), B the later in the table
	B         string  `json:"b"`
	Setting   string  `json:"setting"`   // what differs: "key: A's → B's", comma-separated
	Measured  float64 `json:"measured"`  // B's TPS ÷ A's
	Predicted float64 `json:"predicted"` // the same of the uncalibrated predictions
	Error     float64 `json:"error"`     // Predicted ÷ Measured − 1
}

// PairTable is the A/B pairs of a set of runs and their summary.
type PairTable struct {
	Pairs []Pair   `json:"pairs"`
	Error *Summary `json:"error,omitempty"` // |Error| over the pairs
	// Within10 counts the pairs whose predicted ratio is within 10% of the
	// measured one (the stack issue's bar).
	Within10 int `json:"within_10_percent"`
}

// Pairs finds the A/B pairs among the rows of t (each row's run) and
// compares their measured and predicted ratios.
func Pairs(t TPSTable) PairTable {
	var rows []TPSRow
	for _, s := range t.Series {
		rows = append(rows, s.Rows...)
	}
	var out PairTable
	var errs []float64
	for i, a := range rows {
		for _, b := range rows[i+1:] {
			setting, ok := settingDiff(a.run, b.run)
			if !ok {
				continue
			}
			p := Pair{A: a.Name, B: b.Name, Setting: setting, Measured: b.Measured / a.Measured, Predicted: b.Uncalibrated / a.Uncalibrated}
			p.Error = p.Predicted/p.Measured - 1
			if math.Abs(p.Error) <= 0.10 {
				out.Within10++
			}
			out.Pairs = append(out.Pairs, p)
			errs = append(errs, p.Error)
		}
	}
	out.Error = summarize(errs)
	return out
}

// settingDiff says whether runs a and b are an A/B pair and, when they
// are, names the settings that differ. Both runs' descriptions are
// compared key by key in their JSON form (the published-runs schema), the
// setting keys apart.
func settingDiff(a, b published.Run) (string, bool) {
	if !sameSetup(a, b) {
		return "", false
	}
	ka, kb := settingKeys(a), settingKeys(b)
	var diff []string
	keys := maps.Clone(ka)
	maps.Copy(keys, kb) // a key one run omits (omitempty) differs too
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if fmt.Sprint(ka[k]) != fmt.Sprint(kb[k]) {
			diff = append(diff, fmt.Sprintf("%s: %s → %s", k, shownSetting(ka[k]), shownSetting(kb[k])))
		}
	}
	return strings.Join(diff, ", "), len(diff) > 0
}

// shownSetting prints a setting's value, "unset" for a key the run omits
// (the framework's default applies).
func shownSetting(v any) string {
	if v == nil {
		return "unset"
	}
	return fmt.Sprint(v)
}

// sameSetup says whether runs a and b share what an A/B pair must: the
// source file, model, hardware, framework release, layout, batch and
// checkpointing (fixedPart), neither power-limited.
func sameSetup(a, b published.Run) bool {
	return a.File == b.File && a.Model == b.Model && a.GPU == b.GPU && a.GPUs == b.GPUs && a.Cluster == b.Cluster &&
		a.FrameworkVersion == b.FrameworkVersion && !a.PowerLimited && !b.PowerLimited &&
		reflect.DeepEqual(fixedPart(a), fixedPart(b))
}

// settingKeys is run r's recipe, async TP and precision text, by JSON key.
func settingKeys(r published.Run) map[string]any {
	m := jsonKeys(r.Recipe)
	m["async_tp"], m["precision"] = r.AsyncTP, r.Precision
	return m
}

// fixedPart is what an A/B pair must share: the layout (async TP apart),
// the batch and the checkpointing.
func fixedPart(r published.Run) map[string]any {
	l := r.Layout
	l.AsyncTP = false
	m := jsonKeys(l)
	maps.Copy(m, jsonKeys(r.Batch))
	m["ac"] = r.AC.String()
	return m
}

// jsonKeys is v's JSON object as a map (v is one of the schema's structs,
// which always marshal).
func jsonKeys(v any) map[string]any {
	b, _ := json.Marshal(v)
	m := map[string]any{}
	_ = json.Unmarshal(b, &m)
	return m
}
