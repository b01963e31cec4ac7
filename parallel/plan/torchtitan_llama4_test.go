package plan

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/moe"
)

// TestTorchtitanLlama4: the v0.2.2 TOML names the irope flavors that
// llama4_args defines at 73a0e69 (torchtitan/models/llama4/__init__.py,
// kept in the schema excerpt) with the note on how that model differs; the
// Python export for current torchtitan, which has no Llama 4, is refused
// naming it.
func TestTorchtitanLlama4(t *testing.T) {
	var schema torchtitanTOMLSchema
	torchtitanLoad(t, "v0.2.2-job_config.json", &schema)
	for model, flavor := range map[string]string{"llama-4-scout": "17bx16e_irope", "llama-4-maverick": "17bx128e_irope"} {
		e := TorchtitanExport{Model: model, Seq: 8192, Point: torchtitanPoint(1, 64, 8, moe.AC{Mode: moe.ACFull}, 1, 1, true)}
		var buf bytes.Buffer
		if _, err := e.TOML(&buf); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		var doc map[string]map[string]any
		if _, err := toml.Decode(buf.String(), &doc); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if doc["model"]["name"] != "llama4" || doc["model"]["flavor"] != flavor || !slices.Contains(schema.Flavors["llama4"], flavor) {
			t.Errorf("%s: [model] %v, want llama4 %s (v0.2.2 flavors %v)", model, doc["model"], flavor, schema.Flavors["llama4"])
		}
		if !strings.Contains(buf.String(), "no L2 QK-norm") {
			t.Errorf("%s: TOML lacks the note on v0.2.2's Llama 4:\n%s", model, buf.String())
		}
		if _, err := e.Python(&buf); err == nil || !strings.Contains(err.Error(), "has no Llama 4") {
			t.Errorf("%s: Python export %v, want a refusal naming Llama 4", model, err)
		}
	}
}
