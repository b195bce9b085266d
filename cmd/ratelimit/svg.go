package main

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

// The chart: tokens over time as a line, the capacity as a dashed line,
// window boundaries as light verticals, and a marker per request, green
// when allowed, amber when reserved, red when denied.
const (
	chartW, chartH            = 900.0, 420.0
	padL, padR, padT, padB    = 70.0, 45.0, 50.0, 60.0
	plotW, plotH              = chartW - padL - padR, chartH - padT - padB
	colorAllowed, colorDenied = "#2e7d32", "#c62828"
	colorReserved             = "#ef8f00"
)

func writeSVG(w io.Writer, name string, cfg ratelimit.Config, steps []step, samples []sample, end time.Duration) error {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = cfg.Rate
	}
	lo, hi := 0.0, capacity
	for _, s := range samples {
		lo, hi = math.Min(lo, s.tokens), math.Max(hi, s.tokens)
	}
	hi += (hi - lo) * 0.08
	x := func(d time.Duration) float64 { return padL + plotW*float64(d)/float64(end) }
	y := func(v float64) float64 { return padT + plotH*(hi-v)/(hi-lo) }

	b := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%g" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", padL, escape(describe(name, cfg)))

	// Window boundaries, and time ticks on the x axis.
	if cfg.Kind == ratelimit.FixedWindow && end/cfg.Period <= 200 {
		for t := windowPhase(cfg); t < end; t += cfg.Period {
			if t > 0 {
				p(`<line class="window" x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`+"\n", x(t), padT, x(t), padT+plotH)
			}
		}
	}
	step := niceDuration(end)
	for t := time.Duration(0); t <= end; t += step {
		p(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#444"/>`+"\n", x(t), padT+plotH, x(t), padT+plotH+5)
		p(`<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x(t), padT+plotH+20, clockTime(t.Truncate(time.Millisecond)))
	}
	// Token ticks on the y axis.
	// Each tick a whole multiple of the step, not a sum of steps, so that
	// the one at 0 is 0 and not the sum's rounding error (5.55e-17).
	vstep := niceStep(hi - lo)
	for k := math.Ceil(lo / vstep); k*vstep <= hi; k++ {
		v := k * vstep
		p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#444"/>`+"\n", padL-5, y(v), padL, y(v))
		p(`<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-8, y(v)+4, tick(v, vstep))
	}
	p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`+"\n", padL, padT, padL, padT+plotH)
	p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`+"\n", padL, padT+plotH, padL+plotW, padT+plotH)
	p(`<text x="%g" y="%g" text-anchor="middle">time</text>`+"\n", padL+plotW/2, chartH-15)
	p(`<text x="18" y="%g" text-anchor="middle" transform="rotate(-90 18 %g)">tokens</text>`+"\n", padT+plotH/2, padT+plotH/2)
	if lo < 0 {
		p(`<line class="zero" x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#888"/>`+"\n", padL, y(0), padL+plotW, y(0))
	}

	// Capacity, then the tokens.
	p(`<line class="capacity" x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#1565c0" stroke-dasharray="6 4"/>`+"\n",
		padL, y(capacity), padL+plotW, y(capacity))
	p(`<text x="%g" y="%.1f" fill="#1565c0" text-anchor="end">capacity %s</text>`+"\n", padL+plotW, y(capacity)-5, num(capacity))
	var pts strings.Builder
	for _, s := range samples {
		fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.at), y(s.tokens))
	}
	p(`<polyline class="tokens" points="%s" fill="none" stroke="#1565c0" stroke-width="2"/>`+"\n", strings.TrimSpace(pts.String()))

	for _, s := range steps {
		color := colorAllowed
		switch outcome(s.res) {
		case "denied":
			color = colorDenied
		case "reserved":
			color = colorReserved
		}
		p(`<circle class="request" cx="%.1f" cy="%.1f" r="5" fill="%s"><title>%s</title></circle>`+"\n",
			x(s.at), y(s.before), color, escape(fmt.Sprintf("%s: %s of %s, %s → %s tokens",
				clockTime(s.at), outcome(s.res), num(s.count), num(s.before), num(s.after))))
	}
	// Legend.
	for i, l := range []struct{ color, text string }{{colorAllowed, "allowed"}, {colorReserved, "reserved"}, {colorDenied, "denied"}} {
		lx := padL + plotW - 260 + float64(i)*90
		p(`<circle cx="%g" cy="38" r="5" fill="%s"/><text x="%g" y="42">%s</text>`+"\n", lx, l.color, lx+9, l.text)
	}
	p("</svg>\n")
	return b.Flush()
}

// niceDuration returns a round tick step that cuts end into at most 8.
func niceDuration(end time.Duration) time.Duration {
	for _, d := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond,
		time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if end/d <= 8 {
			return d
		}
	}
	return (end/8 + time.Hour).Truncate(time.Hour)
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten that cuts
// span into at most 6.
func niceStep(span float64) float64 {
	if !(span > 0) {
		return 1
	}
	base := math.Pow(10, math.Floor(math.Log10(span/6)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(base*m) <= 6 {
			return base * m
		}
	}
	return base * 10
}

// tick formats v, a tick of the y axis and a whole multiple of step, in
// the few characters its margin holds, as numtext writes numbers: to the
// step's precision, so that 3 × 0.0002 is 0.0006 (num's three decimals
// made it, 0.0008 and 0.001 all 0.001, and %g wrote the product's
// rounding error), and in numtext's exponent form (2e7, 1e15, -1e6, 2e-6)
// when the plain number is longer than 7 characters, which ran off the
// chart's left edge. %g wrote 2e+07 and 2e-06, which no user writes and
// which the capacity's label and the table, beside them, do not.
func tick(v, step float64) string {
	if v == 0 || !(step > 0) || math.IsInf(v, 0) || math.IsNaN(v) {
		return numtext.Format(v)
	}
	// The digits from v's leading one to the step's last: one more where
	// Log10 of a power of ten falls below it, which the shortest form
	// drops again.
	exp10 := func(x float64) int { return int(math.Floor(math.Log10(math.Abs(x)))) }
	digits := max(1, exp10(v)-exp10(step)+1)
	v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'e', digits-1, 64), 64)
	if s := numtext.Format(v); len(s) <= 7 {
		return s
	}
	return plainExponent(strconv.FormatFloat(v, 'e', -1, 64))
}

func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
