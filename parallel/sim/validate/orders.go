package validate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Order is a tuning sweep among the runs: four or more runs of one source
// file, model, GPU, GPU count, cluster, sequence length and framework
// release that differ in their settings (layout, checkpointing, local
// batch, recipe), and how well the uncalibrated predictions rank them: the
// issue's "predicted order of a series that varies settings matches the
// measured order", judged by Spearman's rank correlation (target ≥ 0.8).
type Order struct {
	Series   string   `json:"series"` // source file, model, GPU count
	Runs     []string `json:"runs"`   // run names (TPSRow.Name), in table order
	Spearman float64  `json:"spearman"`
}

// minOrderRuns is the fewest runs a sweep needs to be ranked: with three,
// ρ takes only the values ±1, ±0.5.
const minOrderRuns = 4

// Orders finds the tuning sweeps among the rows of t (each row's run,
// power-limited runs left out as the TPS table leaves them) and ranks
// their measured and uncalibrated predicted TPS.
func Orders(t TPSTable) []Order {
	type key struct {
		file, model, gpu, cluster, fw string
		gpus, seq                     int
	}
	groups := map[key][]TPSRow{}
	var keys []key
	for _, s := range t.Series {
		for _, row := range s.Rows {
			r := row.run
			k := key{r.File, r.Model, r.GPU, r.Cluster, r.FrameworkVersion, r.GPUs, r.Seq}
			if _, ok := groups[k]; !ok {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], row)
		}
	}
	var out []Order
	for _, k := range keys {
		rows := groups[k]
		if len(rows) < minOrderRuns {
			continue
		}
		o := Order{Series: fmt.Sprintf("%s %s %d×%s", k.file, k.model, k.gpus, k.gpu)}
		var measured, predicted []float64
		for _, r := range rows {
			o.Runs = append(o.Runs, r.Name)
			measured, predicted = append(measured, r.Measured), append(predicted, r.Uncalibrated)
		}
		o.Spearman = Spearman(measured, predicted)
		out = append(out, o)
	}
	return out
}

// Spearman is the rank correlation of x and y (equal lengths ≥ 2): the
// Pearson correlation of their ranks, tied values taking the mean of the
// ranks they span. NaN when either is constant.
func Spearman(x, y []float64) float64 {
	rx, ry := ranks(x), ranks(y)
	n := float64(len(x))
	mean := (n + 1) / 2 // ranks 1…n average (n+1)/2, ties included
	var sxy, sxx, syy float64
	for i := range rx {
		dx, dy := rx[i]-mean, ry[i]-mean
		sxy, sxx, syy = sxy+dx*dy, sxx+dx*dx, syy+dy*dy
	}
	if sxx == 0 || syy == 0 {
		return math.NaN()
	}
	return sxy / math.Sqrt(sxx*syy)
}

// ranks gives each value of v its rank from 1 (smallest), ties their mean.
func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(v[a], v[b]) })
	r := make([]float64, len(v))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && v[idx[j+1]] == v[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j)/2 + 1 // positions i…j hold ranks i+1…j+1
		}
		i = j + 1
	}
	return r
}
