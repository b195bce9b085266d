// Package numtext writes numbers for messages as a user writes them, the
// one form of the library's errors, the driver's and the command
// ratelimit's: %v writes 8388607 as 8.388607e+06 and 1e300 as 1e+300,
// which no user wrote and a limits file does not hold.
package numtext

import (
	"math"
	"strconv"
	"strings"
)

// Format writes x in a form that reads back to x (strconv.ParseFloat, a
// limits file, a flag of the command line): a whole number below 2^53 in
// full digits (8388607, not 8.388607e+06); any other number from 0.0001
// up in plain decimal (0.25, 8388607.5); the rest, below 0.0001 or from
// 2^53 on, in the shortest exponent form, its exponent without a plus
// sign or leading zeros (1e-9, 1e300); NaN, +Inf and -Inf as Go writes
// them.
func Format(x float64) string {
	a := math.Abs(x)
	switch {
	case x == 0:
		return "0"
	case math.IsNaN(x) || math.IsInf(x, 0):
		return strconv.FormatFloat(x, 'g', -1, 64)
	case a < 1<<53 && x == math.Trunc(x):
		return strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 1e-4 && a < 1<<53:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	mant, exp, _ := strings.Cut(strconv.FormatFloat(x, 'e', -1, 64), "e")
	sign := ""
	if exp[0] == '-' {
		sign = "-"
	}
	return mant + "e" + sign + strings.TrimLeft(exp[1:], "0")
}
