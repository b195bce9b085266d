package compare

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRatiosOfFailedContenders requires the table of ratios to give no
// ratio for a cell in which one side decided nothing, every call having
// failed: a library that failed read as 0.00× the best peer, and a peer
// that failed every call was named the best peer when every peer did.
func TestRatiosOfFailedContenders(t *testing.T) {
	m := &MediumReport{Name: "memory", Contenders: []Contender{
		{Name: "ratelimit memstore", Role: Library},
		{Name: "peer a", Role: Peer},
		{Name: "peer b", Role: Peer},
		{Name: "bare thing", Role: Bare},
	}}
	cell := func(g int, medians ...float64) *Cell {
		c := &Cell{Goroutines: g, Keys: 1}
		for i, v := range medians {
			res := &Result{Contender: &m.Contenders[i], Medium: m.Name, Cell: c, Median: v, Calls: 10}
			if v == 0 {
				res.Errors = 10
			}
			c.Results = append(c.Results, res)
		}
		return c
	}
	m.Cells = []*Cell{
		cell(1, 1000, 500, 250, 2000), // all decided
		cell(2, 1000, 0, 0, 2000),     // every peer failed
		cell(3, 0, 500, 250, 2000),    // the library failed
		cell(4, 1000, 0, 250, 0),      // one peer and the baseline failed
	}
	p := &printer{w: &bytes.Buffer{}}
	writeRatios(p, m)
	assert.NoError(t, p.err)
	assert.Equal(t, `| goroutines | keys | ratelimit memstore | best peer | ÷ best peer | bare thing | ÷ thing |
|---:|---:|---:|---|---:|---:|---:|
| 1 | 1 | 1,000 | 500 (peer a) | **2.00×** | 2,000 | **0.50×** |
| 2 | 1 | 1,000 | – | **–** | 2,000 | **0.50×** |
| 3 | 1 | 0 | 500 (peer a) | **–** | 2,000 | **–** |
| 4 | 1 | 1,000 | 250 (peer b) | **4.00×** | 0 | **–** |

`, p.w.(*bytes.Buffer).String())
}
