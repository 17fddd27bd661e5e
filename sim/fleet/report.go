package fleet

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"slices"
	"strings"
)

// WriteJSON writes the report as R18.1's JSON: {"results":[{"policy","hit_rate",…}…]}.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// WriteMarkdown writes the report as a Markdown table, one row per policy (and per load, in a
// first column, when the report is a sweep); a lora trace's adds swaps_per_1k and lora_waits.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	sweep := len(r.loads()) > 1
	lora := slices.ContainsFunc(r.Results, func(x Result) bool { return x.Adapters > 0 })
	replicas := slices.ContainsFunc(r.Results, func(x Result) bool { return x.Replicas > 1 })
	if replicas {
		b.WriteString("| replicas ")
	}
	if sweep {
		b.WriteString("| load ")
	}
	b.WriteString("| policy | hit_rate | ttft_p50_ms | ttft_p99_ms | tokens_per_s | queue_mean_ms | imbalance | slo_attainment | completed | warmups |")
	if lora {
		b.WriteString(" swaps_per_1k | lora_waits |")
	}
	b.WriteString("\n")
	if replicas {
		b.WriteString("|---:")
	}
	if sweep {
		b.WriteString("|---:")
	}
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	if lora {
		b.WriteString("---:|---:|")
	}
	b.WriteString("\n")
	for _, x := range r.Results {
		if replicas {
			fmt.Fprintf(&b, "| %d ", max(x.Replicas, 1))
		}
		if sweep {
			fmt.Fprintf(&b, "| %g ", x.Load)
		}
		fmt.Fprintf(&b, "| %s | %.4f | %.1f | %.1f | %.1f | %.1f | %.3f | %.4f | %d/%d | %d |", x.Policy, x.HitRate,
			x.TTFTP50Ms, x.TTFTP99Ms, x.TokensPerS, x.QueueMeanMs, x.Imbalance, x.SLOAttainment, x.Completed, x.Requests,
			x.Warmups)
		if lora {
			fmt.Fprintf(&b, " %.1f | %d |", x.SwapsPer1k, x.LoRAWaits)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// loads is the report's distinct loads, in the order they first appear.
func (r *Report) loads() []float64 {
	return distinct(r.Results, func(x Result) float64 { return x.Load })
}

// policies is the report's distinct policies, in the order they first appear.
func (r *Report) policies() []string {
	return distinct(r.Results, func(x Result) string { return x.Policy })
}

// distinct is the distinct values of f over rs, in the order they first appear.
func distinct[T comparable](rs []Result, f func(Result) T) []T {
	var out []T
	for _, x := range rs {
		if v := f(x); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// WritePNG draws two bar charts side by side, hit rate (0 to 1) and TTFT p99 (0 to the
// largest, in ms), one bar per policy, with the standard library only: the labels use a small
// built-in bitmap font. A sweep (several loads) is drawn as lines instead (writeSweepPNG).
func (r *Report) WritePNG(w io.Writer) error {
	if len(r.loads()) > 1 {
		return r.writeSweepPNG(w)
	}
	n := len(r.Results)
	const (
		barW, gap, margin, top, plotH, labelH = 90, 50, 40, 48, 300, 50
	)
	panelW := margin + n*(barW+gap) + gap
	W, H := 2*panelW+margin, top+plotH+labelH+margin
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	maxP99 := 0.0
	for _, x := range r.Results {
		maxP99 = max(maxP99, x.TTFTP99Ms)
	}
	if maxP99 <= 0 {
		maxP99 = 1
	}
	ink := color.RGBA{30, 30, 30, 255}
	panels := []struct {
		title string
		value func(Result) float64
		scale float64
		label func(Result) string
		col   color.RGBA
	}{
		{"hit rate", func(x Result) float64 { return x.HitRate }, 1, func(x Result) string { return fmt.Sprintf("%.2f", x.HitRate) },
			color.RGBA{52, 120, 198, 255}},
		{"ttft p99 ms", func(x Result) float64 { return x.TTFTP99Ms }, maxP99, func(x Result) string { return fmt.Sprintf("%.0f", x.TTFTP99Ms) },
			color.RGBA{214, 96, 77, 255}},
	}
	for p, pn := range panels {
		x0 := margin + p*panelW
		base := top + plotH
		text(img, x0, 14, pn.title, 3, ink)
		fill(img, image.Rect(x0, top, x0+1, base+1), ink)                 // y axis
		fill(img, image.Rect(x0, base, x0+n*(barW+gap)+gap, base+1), ink) // x axis
		for i, res := range r.Results {
			bx := x0 + gap + i*(barW+gap)
			h := int(pn.value(res) / pn.scale * float64(plotH-16))
			fill(img, image.Rect(bx, base-h, bx+barW, base), pn.col)
			lbl := pn.label(res)
			text(img, bx+(barW-textWidth(lbl, 2))/2, base-h-14, lbl, 2, ink)
			name := res.Policy
			text(img, bx+(barW-textWidth(name, 2))/2, base+8+(i%2)*16, name, 2, ink)
		}
	}
	return png.Encode(w, img)
}

// lineColors tell a sweep's policies apart.
var lineColors = []color.RGBA{{52, 120, 198, 255}, {214, 96, 77, 255}, {60, 160, 80, 255}, {150, 90, 180, 255},
	{230, 160, 30, 255}, {40, 170, 170, 255}, {120, 120, 120, 255}, {200, 80, 160, 255}}

// writeSweepPNG draws a sweep: TTFT p99 (ms) and SLO attainment against the offered load, one
// line per policy (colours in the legend below), the loads placed by value on the x axis.
func (r *Report) writeSweepPNG(w io.Writer) error {
	loads, pols := r.loads(), r.policies()
	const (
		margin, top, plotW, plotH, axisH, legendRow = 60, 48, 560, 300, 40, 20
	)
	panelW := plotW + 2*margin
	W, H := 2*panelW, top+plotH+axisH+legendRow*((len(pols)+1)/2)+margin
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	ink := color.RGBA{30, 30, 30, 255}
	maxP99 := 1.0
	for _, x := range r.Results {
		maxP99 = max(maxP99, x.TTFTP99Ms)
	}
	panels := []struct {
		title string
		value func(Result) float64
		lo    float64
		hi    float64
		ticks []string
	}{
		{"ttft p99 ms", func(x Result) float64 { return x.TTFTP99Ms }, 0, maxP99, []string{"0", fmt.Sprintf("%.0f", maxP99)}},
		{"slo attainment", func(x Result) float64 { return x.SLOAttainment }, 0, 1, []string{"0", "1"}},
	}
	slices.Sort(loads) // lines join the loads in increasing order, placed by value
	lo, hi := loads[0], loads[len(loads)-1]
	xOf := func(i int) int {
		if hi == lo {
			return plotW / 2
		}
		return int((loads[i] - lo) / (hi - lo) * plotW)
	}
	for p, pn := range panels {
		x0, base := p*panelW+margin, top+plotH
		text(img, x0, 14, pn.title, 3, ink)
		fill(img, image.Rect(x0-1, top, x0, base+1), ink)
		fill(img, image.Rect(x0-1, base, x0+plotW+1, base+1), ink)
		text(img, x0-textWidth(pn.ticks[0], 2)-6, base-5, pn.ticks[0], 2, ink)
		text(img, x0-textWidth(pn.ticks[1], 2)-6, top, pn.ticks[1], 2, ink)
		for i, l := range loads {
			lbl := fmt.Sprintf("%g", l)
			text(img, x0+xOf(i)-textWidth(lbl, 2)/2, base+10, lbl, 2, ink)
		}
		yOf := func(v float64) int {
			f := (v - pn.lo) / (pn.hi - pn.lo)
			return base - int(min(max(f, 0), 1)*float64(plotH-8))
		}
		for k, pol := range pols {
			col := lineColors[k%len(lineColors)]
			px, py := -1, -1
			for i, l := range loads {
				for _, x := range r.Results {
					if x.Policy != pol || x.Load != l {
						continue
					}
					cx, cy := x0+xOf(i), yOf(pn.value(x))
					fill(img, image.Rect(cx-3, cy-3, cx+4, cy+4), col)
					if px >= 0 {
						line(img, px, py, cx, cy, col)
					}
					px, py = cx, cy
				}
			}
		}
	}
	// The legend: "load" under the axes, then the policies in two columns.
	text(img, W/2-textWidth("offered load", 2)/2, top+plotH+axisH-12, "offered load", 2, ink)
	for k, pol := range pols {
		lx, ly := margin+(k%2)*panelW, top+plotH+axisH+(k/2)*legendRow+8
		fill(img, image.Rect(lx, ly, lx+24, ly+8), lineColors[k%len(lineColors)])
		text(img, lx+32, ly-1, pol, 2, ink)
	}
	return png.Encode(w, img)
}

// line draws a 3-pixel-wide segment from (x0, y0) to (x1, y1).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	steps := max(abs(x1-x0), abs(y1-y0), 1)
	for s := 0; s <= steps; s++ {
		x, y := x0+(x1-x0)*s/steps, y0+(y1-y0)*s/steps
		fill(img, image.Rect(x-1, y-1, x+2, y+2), c)
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// glyphs is a 3×5 bitmap font for the labels: each glyph is 5 rows of 3 bits.
var glyphs = map[rune][5]uint8{
	'0': {7, 5, 5, 5, 7}, '1': {2, 6, 2, 2, 7}, '2': {7, 1, 7, 4, 7}, '3': {7, 1, 7, 1, 7},
	'4': {5, 5, 7, 1, 1}, '5': {7, 4, 7, 1, 7}, '6': {7, 4, 7, 5, 7}, '7': {7, 1, 1, 1, 1},
	'8': {7, 5, 7, 5, 7}, '9': {7, 5, 7, 1, 7}, '.': {0, 0, 0, 0, 2}, '_': {0, 0, 0, 0, 7},
	'-': {0, 0, 7, 0, 0}, ' ': {0, 0, 0, 0, 0},
	'a': {2, 5, 7, 5, 5}, 'b': {6, 5, 6, 5, 6}, 'c': {3, 4, 4, 4, 3}, 'd': {6, 5, 5, 5, 6},
	'e': {7, 4, 6, 4, 7}, 'f': {7, 4, 6, 4, 4}, 'g': {3, 4, 5, 5, 3}, 'h': {5, 5, 7, 5, 5},
	'i': {7, 2, 2, 2, 7}, 'j': {1, 1, 1, 5, 2}, 'k': {5, 5, 6, 5, 5}, 'l': {4, 4, 4, 4, 7},
	'm': {5, 7, 7, 5, 5}, 'n': {6, 5, 5, 5, 5}, 'o': {2, 5, 5, 5, 2}, 'p': {6, 5, 6, 4, 4},
	'q': {2, 5, 5, 7, 3}, 'r': {6, 5, 6, 5, 5}, 's': {3, 4, 2, 1, 6}, 't': {7, 2, 2, 2, 2},
	'u': {5, 5, 5, 5, 7}, 'v': {5, 5, 5, 5, 2}, 'w': {5, 5, 7, 7, 5}, 'x': {5, 5, 2, 5, 5},
	'y': {5, 5, 2, 2, 2}, 'z': {7, 1, 2, 4, 7},
}

func textWidth(s string, scale int) int { return len(s) * 4 * scale }

// text draws s at (x, y) (its top left) at scale × the font's size; unknown runes are blank.
func text(img *image.RGBA, x, y int, s string, scale int, c color.RGBA) {
	for _, ch := range strings.ToLower(s) {
		g := glyphs[ch]
		for row := range 5 {
			for col := range 3 {
				if g[row]&(4>>col) != 0 {
					fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
		x += 4 * scale
	}
}
