package main

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
)

// reportTables are the ids of the tables every report has.
var reportTables = []string{"settings", "stages", "plans", "breakdown", "collectives", "classes", "memory"}

func TestPlanReportHTML(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	_, stderr, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--report", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "wrote "+path+" (HTML report)") {
		t.Errorf("stderr lacks the wrote line:\n%s", stderr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, id := range reportTables {
		if !strings.Contains(page, `<table id="`+id+`">`) {
			t.Errorf("report lacks table %q", id)
		}
	}
	for _, n := range report.PlotNames() {
		if !regexp.MustCompile(`<figure id="` + n + `"><svg `).MatchString(page) {
			t.Errorf("report lacks the inline SVG of %s", n)
		}
	}
	if strings.Contains(page, "<?xml") {
		t.Error("an SVG's XML prolog was inlined into the HTML")
	}
	// Self-contained: nothing to fetch (the SVG namespace URIs are names,
	// not loads).
	if m := regexp.MustCompile(`(?i)(src|href)\s*=|url\(|@import|<link|<script`).FindString(page); m != "" {
		t.Errorf("report refers to something outside itself: %q", m)
	}
	// The batch was left free: the settings and a note say what the best
	// plan steps, as the table does.
	for _, w := range []string{"free (no gradient accumulation): the best plan steps ", "set --global-batch to hold the batch your recipe trains with."} {
		if !strings.Contains(page, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	if !strings.Contains(page, "Uncalibrated") {
		t.Error("report without --calibration does not say it is uncalibrated")
	}
	// An existing report is kept without --force.
	if _, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--report", path); err == nil {
		t.Error("second run overwrote the report without --force")
	}
}

// chromium finds Debian's chromium (or another Chromium build) on PATH.
func chromium() string {
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// TestPlanReportInChromium opens the report in headless Chromium, checks
// that the rendered DOM holds the tables and the plots, and that a
// screenshot shows the plots' coloured curves.
func TestPlanReportInChromium(t *testing.T) {
	bin := chromium()
	if bin == "" {
		t.Skip("Chromium not found on PATH (Debian: apt-get install chromium): the report is not rendered; TestPlanReportHTML still checks its markup")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	if _, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--report", path); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "shot.png")
	dom := headless(t, bin, dir, "--dump-dom", "file://"+path)
	for _, id := range reportTables {
		if !strings.Contains(dom, `<table id="`+id+`">`) {
			t.Errorf("rendered DOM lacks table %q", id)
		}
	}
	if n := strings.Count(dom, "<svg "); n < len(report.PlotNames()) {
		t.Errorf("rendered DOM has %d SVG plots, want %d", n, len(report.PlotNames()))
	}
	headless(t, bin, dir, "--screenshot="+shot, "--window-size=1200,9000", "file://"+path)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	// Tables are black on white; only the plots' curves and bars are
	// coloured. Five plots' worth of coloured pixels means they rendered.
	if n := colouredPixels(img); n < 5000 {
		t.Errorf("screenshot has %d coloured pixels: the plots did not render", n)
	}
}

// headless runs Chromium headless with a private profile and returns stdout.
func headless(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--hide-scrollbars"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// colouredPixels counts pixels whose channels differ by more than 60 of
// 255: saturated colour, not the greys of text, rules and antialiasing.
func colouredPixels(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			hi, lo := max(r, g, bl)>>8, min(r, g, bl)>>8
			if hi-lo > 60 {
				n++
			}
		}
	}
	return n
}

// TestPlanReportCalibration: with --calibration the page shows each
// parameter's value and status, the notes and one residual row per run,
// and says the calibration has no intervals.
func TestPlanReportCalibration(t *testing.T) {
	dir := t.TempDir()
	cal := filepath.Join(dir, "cal.json")
	if err := os.WriteFile(cal, []byte(`{"gemm_scale":0.9,"fitted":["gemm_scale"],"kept_default":["net_efficiency"],
		"notes":["allocator_overhead kept: no run reports memory"],"residuals":[0.012,-0.034],"memory_residuals":[0.05,null]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "report.html")
	if _, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--calibration", cal, "--report", path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, w := range []string{`<table id="calibration">`, `<td class="n">gemm_scale</td><td class="n">0.9</td><td class="n">fitted</td>`,
		`<td class="n">net_efficiency</td><td class="n">default</td><td class="n">kept at its default`,
		"allocator_overhead kept: no run reports memory",
		// html/template writes "+" as "&#43;".
		`<td class="n">0</td><td class="n">&#43;1.2%</td><td class="n">&#43;5.0%</td>`,
		`<td class="n">1</td><td class="n">-3.4%</td><td class="n">not measured</td>`,
		"carries no fit covariance", `<th>90% interval</th>`} {
		if !strings.Contains(page, w) {
			t.Errorf("report lacks %q", w)
		}
	}
}
