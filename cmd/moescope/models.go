package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe/hf"
)

func init() {
	register(command{"models", "list the built-in models with total and active parameters", runModels})
}

// modelInfo is one row of `moescope models`.
type modelInfo struct {
	Name         string `json:"name"`
	ModelType    string `json:"model_type"`
	Layers       int    `json:"layers"`
	MoELayers    int    `json:"moe_layers"`
	Experts      int    `json:"experts"`
	TopK         int    `json:"top_k"`
	ParamsTotal  int64  `json:"params_total"`
	ParamsActive int64  `json:"params_active"`
	Source       string `json:"source"`
}

func runModels(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("models", stderr)
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var rows []modelInfo
	for _, n := range hf.Builtins() {
		c, err := hf.Load(n)
		if err != nil {
			return err
		}
		p, err := flops.CountParams(c)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		rows = append(rows, modelInfo{n, c.ModelType, c.Layers, c.MoELayers(), c.Experts, c.TopK, p.Total, p.Active, c.Source})
	}
	if *asJSON {
		return writeJSON(stdout, "models", rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "name\tmodel_type\tlayers\tmoe layers\texperts\ttop-k\ttotal params\tactive params\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.Name, r.ModelType, r.Layers, r.MoELayers, r.Experts, r.TopK, report.FmtInt(r.ParamsTotal), report.FmtInt(r.ParamsActive))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\nactive = every non-routed parameter (embeddings and LM head included) + top-k routed + shared experts; sources: moescope models --json")
	return nil
}
