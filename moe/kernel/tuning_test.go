package kernel

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// tuningRow returns the table's row of that name.
func tuningRow(t *testing.T, name string) tuning {
	t.Helper()
	for _, r := range tunings {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("no tuning row %q", name)
	return tuning{}
}

func TestTuningFor(t *testing.T) {
	avx512 := []string{"avx512", "avx2", "generic"}
	// Vendor strings, families and models as cpuid reports them: AMD's
	// "Processor Programming Reference" documents for families 19h (Zen 3:
	// Ryzen 5000 model 21h, EPYC 7003 model 01h; Zen 4: Ryzen 7000 model
	// 61h) and 1Ah (Zen 5); Intel's SDM vol. 4 table 2-1 for family 6
	// model 8Fh (Sapphire Rapids) and 55h (Skylake-SP); the Zen 5 guest
	// this row was measured on reports family 26 model 2.
	for _, c := range []struct {
		vendor        string
		family, model int
		supported     []string
		want          string
		exact         bool
	}{
		{"AuthenticAMD", 0x1A, 2, avx512, "zen5", true},
		{"AuthenticAMD", 0x1A, 0x44, avx512, "zen5", true}, // a whole-family row
		{"GenuineIntel", 6, 0x8F, avx512, "sapphirerapids", true},
		{"AuthenticAMD", 0x19, 0x21, []string{"avx2", "generic"}, "zen3", true},
		{"AuthenticAMD", 0x19, 0x01, []string{"avx2", "generic"}, "zen3", true},
		// Zen 4 is family 19h like Zen 3 (distance 2 models from 5Fh),
		// one family from Zen 5 (256): the Zen 3 row, not its own.
		{"AuthenticAMD", 0x19, 0x61, avx512, "zen3", false},
		{"GenuineIntel", 6, 0x55, avx512, "sapphirerapids", false},
		// No row of the vendor: the first row whose kernel it supports.
		{"HygonGenuine", 0x18, 0, []string{"avx2", "generic"}, "zen3", false},
		{"CentaurHauls", 6, 0, []string{"generic"}, "zen5", false},
	} {
		got, exact := tuningFor(c.vendor, c.family, c.model, c.supported)
		if got.name != c.want || exact != c.exact {
			t.Errorf("tuningFor(%s, %#x, %#x) = %s exact %v, want %s exact %v", c.vendor, c.family, c.model, got.name, exact, c.want, c.exact)
		}
	}
}

func TestPickKernel(t *testing.T) {
	ks := []*microKernel{{name: "avx512"}, {name: "avx2"}, genericKernel}
	zen3 := tuningRow(t, "zen3")
	if k := pickKernel(zen3, true, ks); k.name != "avx2" {
		t.Errorf("own row: %s, want the row's avx2", k.name)
	}
	// Only near the row: the fastest kernel, not the row's.
	if k := pickKernel(zen3, false, ks); k.name != "avx512" {
		t.Errorf("nearest row: %s, want the fastest, avx512", k.name)
	}
	// The row's kernel missing (a purego build): the fastest there is.
	if k := pickKernel(tuningRow(t, "zen5"), true, []*microKernel{genericKernel}); k != genericKernel {
		t.Errorf("purego: %s, want generic", k.name)
	}
}

// tuningRecord is one entry of tuning_records.json: a measurement that set
// a row of the table, with the machine it ran on.
type tuningRecord struct {
	ID      string `json:"id"`
	Row     string `json:"row"`
	Date    string `json:"date"`
	Before  string `json:"before"` // the commit the measurement compared against, or that it set
	Machine struct {
		Brand  string `json:"brand"`
		Vendor string `json:"vendor"`
		Family int    `json:"family"`
		Model  int    `json:"model"`
	} `json:"machine"`
	Commands []string `json:"commands"`
	Figures  []string `json:"figures"`
	Decision string   `json:"decision"`
}

// TestTuningRecords checks the table against its records: every record a
// row cites exists, was measured on a part whose own row is that row, and
// says what it measured and how.
func TestTuningRecords(t *testing.T) {
	b, err := os.ReadFile("tuning_records.json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []tuningRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	byID := map[string]tuningRecord{}
	for _, r := range recs {
		if r.Date == "" || r.Machine.Brand == "" || len(r.Commands) == 0 || len(r.Figures) == 0 || r.Decision == "" {
			t.Errorf("record %q: date, machine, commands, figures and decision are required", r.ID)
		}
		row, exact := tuningFor(r.Machine.Vendor, r.Machine.Family, r.Machine.Model, []string{"avx512", "avx2", "generic"})
		if !exact || row.name != r.Row {
			t.Errorf("record %q names row %s, but its machine (%s family %d model %d) selects %s (own row: %v)",
				r.ID, r.Row, r.Machine.Vendor, r.Machine.Family, r.Machine.Model, row.name, exact)
		}
		byID[r.ID] = r
	}
	for _, row := range tunings {
		for _, id := range row.record {
			if r, ok := byID[id]; !ok || r.Row != row.name {
				t.Errorf("row %s cites record %q, which is missing or names another row", row.name, id)
			}
		}
	}
	for _, r := range recs {
		if !slices.ContainsFunc(tunings, func(row tuning) bool { return slices.Contains(row.record, r.ID) }) {
			t.Errorf("record %q is cited by no row", r.ID)
		}
	}
}
