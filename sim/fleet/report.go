package fleet

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"strings"
)

// WriteJSON writes the report as R18.1's JSON: {"results":[{"policy","hit_rate",…}…]}.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// WriteMarkdown writes the report as a Markdown table, one row per policy.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| policy | hit_rate | ttft_p50_ms | ttft_p99_ms | tokens_per_s | queue_mean_ms | imbalance | slo_attainment | completed |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %.4f | %.1f | %.1f | %.1f | %.1f | %.3f | %.4f | %d/%d |\n", x.Policy, x.HitRate,
			x.TTFTP50Ms, x.TTFTP99Ms, x.TokensPerS, x.QueueMeanMs, x.Imbalance, x.SLOAttainment, x.Completed, x.Requests)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WritePNG draws two bar charts side by side, hit rate (0 to 1) and TTFT p99 (0 to the
// largest, in ms), one bar per policy, with the standard library only: the labels use a small
// built-in bitmap font.
func (r *Report) WritePNG(w io.Writer) error {
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
