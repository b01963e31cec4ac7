package titanlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Step is one logged training step of rank 0, as MetricsProcessor.log
// prints it (torchtitan/components/metrics.py at v0.2.2 73a0e69 and main
// b5bcd76: the same format, main allowing `mfu: N/A`).
type Step struct {
	Step int
	Loss float64
	// MemoryGiB is max_reserved since the previous logged step in GiB
	// (2^30 bytes, DeviceMemoryMonitor._to_gib) and MemoryPct the same as
	// a percentage of the device's capacity.
	MemoryGiB, MemoryPct float64
	TPS                  float64  // tokens per second per device, printed rounded
	MFU                  *float64 // fraction; nil where the log says N/A
	Line                 int      // 1-based line of the file
}

// Log is what one console log says about its run.
type Log struct {
	Name  string
	Steps []Step // rank 0's, in logged order
	// Config is the JSON printed after `Running with configs:` (nil when
	// the log has none) and ConfigLine the line it starts on.
	Config     map[string]any
	ConfigLine int
	// CapacityGiB is the device capacity the log reports (0 when absent),
	// DeviceName its name for messages.
	CapacityGiB float64
	DeviceName  string
	// Facts are the batch, sequence length, degrees and model the log's
	// start-up lines state, checked against the job config.
	Facts Facts
	// Notes state what was skipped and why.
	Notes []string
}

var (
	// ANSI select-graphic-rendition codes: Color's fields are all of the
	// form ESC [ … m (torchtitan/tools/utils.py).
	ansiRE = regexp.MustCompile("\x1b\\[[0-9;]*m")
	// torchrun's per-rank prefix "[<role><local_rank>]:"; run_train.sh's
	// role is "rank", torchrun's default role is "default".
	rankRE = regexp.MustCompile(`^\[(?:rank|default)(\d+)\]:`)
	// The logger header of torchtitan/tools/logging.py init_logger
	// (asctime is logging's default "YYYY-MM-DD HH:MM:SS,mmm").
	headerRE = regexp.MustCompile(`^\[titan\] \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} - \S+ - [A-Z]+ - `)
	// MetricsProcessor.log's line: step {:2}, loss {:8.5f}, grad_norm
	// {:7.4f}, memory {:5.2f}GiB({:.2f}%), tps {round:,}, tflops {:,.2f},
	// mfu {:.2f}% or N/A.
	stepRE = regexp.MustCompile(`^step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*\S+\s+memory:\s*(\d+\.\d+)GiB\((\d+\.\d+)%\)\s+` +
		`tps:\s*(\d[\d,]*)\s+tflops:\s*\d[\d,]*\.\d+\s+mfu:\s*(N/A|\d+\.\d+%)\s*$`)
	capacityRE = regexp.MustCompile(`^[A-Z]+ capacity: (.+) with (\d+\.\d+)GiB memory\s*$`)
)

const configMarker = "Running with configs: "

// maxConfigLines bounds the printed config: torchtitan's is a few hundred
// lines; a marker with no end must not swallow the rest of the log.
const maxConfigLines = 20000

type line struct {
	no   int
	rank int // -1: no torchrun prefix
	msg  string
}

// splitLines strips colours and the rank prefix from every line and says
// whether the last line was cut short (no final newline).
func splitLines(data []byte) (lines []line, truncated bool) {
	raw := strings.Split(string(data), "\n")
	truncated = len(data) > 0 && data[len(data)-1] != '\n'
	if !truncated {
		raw = raw[:len(raw)-1]
	}
	for i, s := range raw {
		s = ansiRE.ReplaceAllString(strings.TrimRight(s, "\r"), "")
		l := line{no: i + 1, rank: -1}
		if m := rankRE.FindStringSubmatch(s); m != nil {
			l.rank, _ = strconv.Atoi(m[1])
			s = s[len(m[0]):]
		}
		l.msg = strings.TrimLeft(s, " ")
		lines = append(lines, l)
	}
	return lines, truncated
}

// rank0 keeps the lines of rank 0: the [rank0]: lines when the log has
// torchrun prefixes, else every line (a single process's output).
func rank0(name string, lines []line) ([]line, []string, error) {
	ranks := map[int]int{}
	for _, l := range lines {
		if l.rank >= 0 {
			ranks[l.rank]++
		}
	}
	if len(ranks) == 0 {
		return lines, nil, nil
	}
	if ranks[0] == 0 {
		var seen []string
		for r := range ranks {
			seen = append(seen, strconv.Itoa(r))
		}
		sort.Strings(seen)
		return nil, nil, fmt.Errorf("%s: no [rank0]: lines (ranks seen: %s): torchtitan's metrics are rank 0's; run with LOG_RANK=0", name, strings.Join(seen, ", "))
	}
	var out []line
	for _, l := range lines {
		if l.rank == 0 {
			out = append(out, l)
		}
	}
	var notes []string
	if others := len(lines) - len(out); others > 0 {
		notes = append(notes, fmt.Sprintf("%s: %d line(s) of other ranks or of the launcher skipped: only rank 0's are read", name, others))
	}
	return out, notes, nil
}

// Parse reads a torchtitan console log. A step line that does not match
// torchtitan's format is an error, except a last line cut short (a log
// copied while the job ran), which is skipped with a note.
func Parse(name string, data []byte) (*Log, error) {
	all, truncated := splitLines(data)
	lines, notes, err := rank0(name, all)
	if err != nil {
		return nil, err
	}
	lg := &Log{Name: name, Notes: notes}
	last := -1
	if truncated && len(all) > 0 {
		last = all[len(all)-1].no
	}
	seen := map[int]int{}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		msg := headerRE.ReplaceAllString(l.msg, "")
		switch {
		case strings.HasPrefix(msg, "step:"):
			st, err := parseStep(msg)
			if err != nil && l.no == last {
				lg.Notes = append(lg.Notes, fmt.Sprintf("%s: line %d: the last line is cut short (no final newline); skipped", name, l.no))
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: line %d: %w", name, l.no, err)
			}
			st.Line = l.no
			if prev, ok := seen[st.Step]; ok {
				return nil, fmt.Errorf("%s: line %d: step %d already logged at line %d: two runs in one log? give each its own file", name, l.no, st.Step, prev)
			}
			if n := len(lg.Steps); n > 0 && st.Step < lg.Steps[n-1].Step {
				return nil, fmt.Errorf("%s: line %d: step %d after step %d: steps must increase (a restarted run? give each its own file)", name, l.no, st.Step, lg.Steps[n-1].Step)
			}
			seen[st.Step] = l.no
			lg.Steps = append(lg.Steps, st)
		case strings.HasPrefix(msg, configMarker):
			n, err := lg.readConfig(lines[i:], msg[len(configMarker):])
			if err != nil {
				return nil, err
			}
			i += n - 1
		default:
			if ok, err := lg.readFact(l.no, msg); ok || err != nil {
				if err != nil {
					return nil, err
				}
				continue
			}
			if m := capacityRE.FindStringSubmatch(msg); m != nil {
				lg.DeviceName = m[1]
				lg.CapacityGiB, _ = strconv.ParseFloat(m[2], 64)
			}
		}
	}
	return lg, nil
}

// parseStep reads one MetricsProcessor line.
func parseStep(msg string) (Step, error) {
	m := stepRE.FindStringSubmatch(msg)
	if m == nil {
		return Step{}, fmt.Errorf("%q: not a step line of torchtitan's format "+
			"(`step: N  loss: …  grad_norm: …  memory: X.XXGiB(Y.YY%%)  tps: N,NNN  tflops: …  mfu: …%%`, components/metrics.py)", msg)
	}
	var st Step
	st.Step, _ = strconv.Atoi(m[1])
	st.Loss, _ = strconv.ParseFloat(m[2], 64) // "nan" parses; loss is not used
	st.MemoryGiB, _ = strconv.ParseFloat(m[3], 64)
	st.MemoryPct, _ = strconv.ParseFloat(m[4], 64)
	tps, err := strconv.ParseFloat(strings.ReplaceAll(m[5], ",", ""), 64)
	if err != nil || math.IsInf(tps, 0) {
		return Step{}, fmt.Errorf("tps %q: not a number", m[5])
	}
	st.TPS = tps
	if m[6] != "N/A" {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(m[6], "%"), 64)
		v /= 100
		st.MFU = &v
	}
	return st, nil
}

// readConfig decodes the JSON that starts after the marker on lines[0]
// and continues on the next lines of the same rank, and returns how many
// lines it spans.
func (lg *Log) readConfig(lines []line, first string) (int, error) {
	if lg.Config != nil {
		return 0, fmt.Errorf("%s: line %d: a second printed config (the first at line %d): two runs in one log? give each its own file", lg.Name, lines[0].no, lg.ConfigLine)
	}
	var b bytes.Buffer
	var sc braceScanner
	for n := 1; n <= len(lines) && n <= maxConfigLines; n++ {
		text := first
		if n > 1 {
			b.WriteByte('\n')
			text = lines[n-1].msg
		}
		b.WriteString(text)
		// Decode only once the braces balance: trying every line would
		// cost the square of the config's length.
		if !sc.feed(text) {
			continue
		}
		var cfg map[string]any
		if err := json.Unmarshal(b.Bytes(), &cfg); err != nil {
			return 0, fmt.Errorf("%s: line %d: the printed config is not JSON: %v", lg.Name, lines[0].no, err)
		}
		lg.Config, lg.ConfigLine = cfg, lines[0].no
		return n, nil
	}
	return 0, fmt.Errorf("%s: line %d: the printed config (`%s{…}`) never ends: the log is cut short inside it", lg.Name, lines[0].no, configMarker)
}

// braceScanner tracks JSON nesting outside strings across lines.
type braceScanner struct {
	depth            int
	inString, escape bool
	opened           bool
}

// feed scans s and reports whether the outermost value has closed.
func (sc *braceScanner) feed(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case sc.escape:
			sc.escape = false
		case sc.inString && c == '\\':
			sc.escape = true
		case c == '"':
			sc.inString = !sc.inString
		case sc.inString:
		case c == '{' || c == '[':
			sc.depth++
			sc.opened = true
		case c == '}' || c == ']':
			sc.depth--
		}
	}
	return sc.opened && sc.depth <= 0
}
