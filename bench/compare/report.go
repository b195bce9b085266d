package compare

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// WriteMarkdown writes the report as Markdown: the run's settings, then
// for each medium a table of every contender in every cell and a table of
// the library's ratios, then the bound of every contender, and any
// violation.
func (r *Report) WriteMarkdown(w io.Writer) error {
	p := &printer{w: w}
	o := r.Options
	kind := "token bucket"
	if o.Limit.Kind != 0 {
		kind = o.Limit.Kind.String()
	}
	p.f("Limit: %d per %v per key, a burst of %d (ratelimit as a %s). "+
		"Matrix: %s goroutines × %s keys; %s of %v slices per cell after a warm-up round. "+
		"%s/%s, %d CPUs, %s. Took %v.\n\n",
		o.Limit.Rate, o.Limit.Period, o.Limit.Rate, kind,
		joinInts(o.Goroutines), joinInts(o.Keys), plural(o.Rounds, "round"), o.Slice,
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), r.Elapsed.Round(time.Second))
	for _, m := range r.Media {
		p.f("### %s\n\n", m.Name)
		if m.Skipped != "" {
			p.f("Skipped: %s.\n\n", m.Skipped)
			continue
		}
		p.f("%s. Decisions per second (calls answered without an error): the median of the rounds, ± half their range.\n\n", m.Addr)
		p.f("| goroutines | keys | contender | decisions/s | ± | p50 | p99 | granted | errors | check |\n")
		p.f("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, c := range m.Cells {
			for _, res := range c.Results {
				name := res.Contender.Name
				if res.Contender.Role == Library {
					name = "**" + name + "**"
				}
				p.f("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
					c.Goroutines, commas(int64(c.Keys)), name, perSec(res.Median), spread(res),
					latency(res.P50), latency(res.P99), share(res.Granted, res.Calls), commas(res.Errors), verdict(res.Check))
			}
		}
		p.f("\n")
		writeRatios(p, m)
		for _, c := range m.Cells {
			for _, res := range c.Results {
				if res.Err != nil {
					p.f("- %s, %s: %s, the first: %v\n", res.Contender.Name, c, plural64(res.Errors, "error"), res.Err)
				}
			}
		}
		if m.Cleanup != nil {
			p.f("- cleaning up failed: %v\n", m.Cleanup)
		}
		p.f("\n")
	}
	writeBounds(p, r)
	if v := r.Violations(); len(v) > 0 {
		p.f("### VIOLATIONS\n\n")
		for _, res := range v {
			p.f("- **%s** (%s, %s) granted more than it allows: %s\n",
				res.Contender.Name, res.Medium, res.Cell, res.Check.Worst)
		}
		p.f("\n")
	}
	return p.err
}

// writeRatios writes the library's median decisions per second over the
// best peer's and over each bare baseline's, cell by cell.
func writeRatios(p *printer, m *MediumReport) {
	var lib, bares []int
	peers := false
	for i, c := range m.Contenders {
		switch c.Role {
		case Library:
			lib = append(lib, i)
		case Peer:
			peers = true
		case Bare:
			bares = append(bares, i)
		}
	}
	if len(lib) != 1 || (!peers && len(bares) == 0) {
		return
	}
	l := lib[0]
	p.f("| goroutines | keys | %s |", m.Contenders[l].Name)
	if peers {
		p.f(" best peer | ÷ best peer |")
	}
	for _, b := range bares {
		p.f(" %s | ÷ %s |", m.Contenders[b].Name, strings.TrimPrefix(m.Contenders[b].Name, "bare "))
	}
	p.f("\n|---:|---:|---:|")
	if peers {
		p.f("---|---:|")
	}
	for range bares {
		p.f("---:|---:|")
	}
	p.f("\n")
	for _, c := range m.Cells {
		libRate := c.Results[l].Median
		p.f("| %d | %s | %s |", c.Goroutines, commas(int64(c.Keys)), perSec(libRate))
		if peers {
			// A peer that decided nothing (every call failed) is no
			// measure: the cell has no best peer when none decided.
			var best *Result
			for _, res := range c.Results {
				if res.Contender.Role == Peer && res.Median > 0 && (best == nil || res.Median > best.Median) {
					best = res
				}
			}
			if best == nil {
				p.f(" – | **–** |")
			} else {
				p.f(" %s (%s) | **%s** |", perSec(best.Median), best.Contender.Name, ratio(libRate, best.Median))
			}
		}
		for _, b := range bares {
			p.f(" %s | **%s** |", perSec(c.Results[b].Median), ratio(libRate, c.Results[b].Median))
		}
		p.f("\n")
	}
	p.f("\n")
}

// writeBounds lists what each contender was checked against.
func writeBounds(p *printer, r *Report) {
	p.f("### Bounds checked\n\n")
	p.f("Granted is the share of the counted calls that were granted. Every grant of a cell, warm-up included, " +
		"is checked key by key: no run of grants may exceed what the contender's algorithm allows over the span " +
		"the run could have been decided in (from its first call to its last answer, widened by 1 ms and 0.1%% " +
		"for clocks of whole milliseconds and clock rates), with or without the grants answered slowest. The margin is how far, in tokens, the worst run stayed " +
		"below its bound. The most a contender may grant one key within any span S of its clock:\n\n")
	seen := map[string]bool{}
	for _, m := range r.Media {
		for _, c := range m.Contenders {
			if m.Skipped != "" || seen[c.Name] {
				continue
			}
			seen[c.Name] = true
			p.f("- %s: %s\n", c.Name, c.Bound(r.Options.Limit))
		}
	}
	p.f("\n")
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = commas(int64(n))
	}
	return strings.Join(s, ", ")
}

// commas writes n with thousands separators.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// perSec rounds decisions per second to three significant digits: with
// decimals below 100 (bbolt's Batch from one goroutine makes fewer than
// 100 a second).
func perSec(v float64) string {
	if v <= 0 || math.IsNaN(v) {
		return "0"
	}
	e := int(math.Floor(math.Log10(v))) // v is in [10^e, 10^(e+1))
	if e >= 2 {
		mag := math.Pow(10, float64(e-2))
		return commas(int64(math.Round(v/mag) * mag))
	}
	digits := 2 - e
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if r, _ := strconv.ParseFloat(s, 64); r >= math.Pow(10, float64(e+1)) {
		// Rounding carried into one more digit: 99.96 is 100, not 100.0.
		s = strconv.FormatFloat(v, 'f', digits-1, 64)
	}
	return s
}

func spread(res *Result) string {
	if res.Median <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*(res.Max-res.Min)/2/res.Median)
}

// ratio returns a over b, or a dash when either decided nothing: 0.00×
// would read as a library that lost, when it failed.
func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func share(n, of int64) string {
	if of == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

func latency(d time.Duration) string {
	us := float64(d) / 1e3
	switch {
	case d == 0:
		return "–"
	case us < 10:
		return fmt.Sprintf("%.2f µs", us)
	case us < 1000:
		return fmt.Sprintf("%.0f µs", us)
	default:
		return fmt.Sprintf("%.2f ms", us/1e3)
	}
}

func verdict(c Check) string {
	switch {
	case c.Grants == 0:
		return "no grants"
	case c.Violated():
		return fmt.Sprintf("**VIOLATED** by %.2f", c.Excess)
	}
	return fmt.Sprintf("ok (margin %.2f)", max(-c.Excess, 0)) // not "-0.00"
}

// String names the cell: "8 goroutines, 10,000 keys".
func (c *Cell) String() string {
	return plural(c.Goroutines, "goroutine") + ", " + plural(c.Keys, "key")
}

func plural(n int, noun string) string { return plural64(int64(n), noun) }

func plural64(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return commas(n) + " " + noun + "s"
}
