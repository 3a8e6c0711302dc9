package sim

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report side by side: one column a policy, one row
// a measure, then what the numbers say.
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "imgctx simulate: %s on %s (profile %s, %s wire): %d steps, %d distinct images in %d attachments, %s bytes an image on average\n\n",
		r.Workload, r.Model, r.Profile, r.Format, r.Steps, r.Images, r.Occurrences, thousands(r.ImageBytes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(p PolicyReport) string) {
		cells := []string{name}
		for _, p := range r.Policies {
			cells = append(cells, f(p))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row("", func(p PolicyReport) string { return p.Policy })
	row("requests", func(p PolicyReport) string { return fmt.Sprint(p.Requests) })
	row("failed (window, image limit)", func(p PolicyReport) string { return fmt.Sprint(p.Failed) })
	row("compactions", func(p PolicyReport) string { return fmt.Sprint(p.Compactions) })
	row("input tokens", func(p PolicyReport) string { return thousands(p.Input) })
	row("cache-read tokens", func(p PolicyReport) string { return thousands(p.CacheRead) })
	row("cache-write tokens", func(p PolicyReport) string { return thousands(p.CacheWrite) })
	row("output tokens", func(p PolicyReport) string { return thousands(p.Output) })
	row("cost (USD)", func(p PolicyReport) string { return fmt.Sprintf("$%.2f", p.Dollars) })
	row("prefix breaks", func(p PolicyReport) string { return fmt.Sprint(p.PrefixBreaks) })
	row("  by image removals", func(p PolicyReport) string { return fmt.Sprint(p.ImageBreaks) })
	row("cache writes from image removals", func(p PolicyReport) string { return percent(p.ImageWriteShare) })
	row("steady-state cache-hit rate", func(p PolicyReport) string { return percent(p.SteadyHitRate) })
	row("images per request, mean", func(p PolicyReport) string { return fmt.Sprintf("%.1f", p.ImagesMean) })
	row("images per request, min", func(p PolicyReport) string { return fmt.Sprint(p.ImagesMin) })
	row("last 10 screenshots visible", func(p PolicyReport) string { return percent(p.Recency) })
	row("cost over the hindsight frontier", func(p PolicyReport) string {
		if p.FrontierGap == nil {
			return "n/a"
		}
		return fmt.Sprintf("%+.0f%%", 100**p.FrontierGap)
	})
	row("largest request (bytes)", func(p PolicyReport) string { return thousands(int64(p.LargestRequest)) })
	row("stored image bytes", func(p PolicyReport) string { return thousands(p.StoredBytes) })
	row("  unique image bytes", func(p PolicyReport) string { return thousands(p.UniqueBytes) })
	reasons := map[string]bool{}
	for _, p := range r.Policies {
		for k := range p.Removed {
			reasons[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(reasons)) {
		row("images removed: "+k, func(p PolicyReport) string { return fmt.Sprint(p.Removed[k]) })
	}
	tw.Flush()
	if f := r.Frontier; f != nil && len(f.Points) > 0 {
		fmt.Fprintf(w, "\nhindsight frontier (%s):\n", f.Assumes)
		for _, p := range f.Points {
			fmt.Fprintf(w, "  %6.1f images per request: $%.2f (%d removal batches)\n", p.Images, p.Dollars, p.Batches)
		}
	}
	fmt.Fprintln(w)
	for _, line := range r.Notes {
		fmt.Fprintln(w, line)
	}
}

// Reading is what the table says about imgctx, in plain sentences: its
// cost against every policy that failed no request, and what each costs
// in images shown.
func (r *Report) Reading() []string {
	var out []string
	var ours *PolicyReport
	var cheapest *PolicyReport
	for i := range r.Policies {
		p := &r.Policies[i]
		if p.Policy == "imgctx" {
			ours = p
		}
		if p.Failed == 0 && (cheapest == nil || p.Dollars < cheapest.Dollars) {
			cheapest = p
		}
	}
	for _, p := range r.Policies {
		if p.Failed > 0 {
			out = append(out, fmt.Sprintf("%s: %d of %d requests refused by the provider %v.", p.Policy, p.Failed, p.Requests, p.FailedBy))
		}
	}
	if ours == nil {
		return out
	}
	switch {
	case cheapest == nil:
		out = append(out, "No policy ran without a refused request.")
	case cheapest.Policy == "imgctx":
		out = append(out, fmt.Sprintf("imgctx is the cheapest policy with no refused request: $%.2f, %.1f images per request.", ours.Dollars, ours.ImagesMean))
	default:
		out = append(out, fmt.Sprintf("imgctx is not the cheapest policy with no refused request: %s costs $%.2f showing %.1f images per request; imgctx $%.2f (%.2f×) showing %.1f.",
			cheapest.Policy, cheapest.Dollars, cheapest.ImagesMean, ours.Dollars, ours.Dollars/cheapest.Dollars, ours.ImagesMean))
	}
	for _, p := range r.Policies {
		if p.Policy == "imgctx" || p.Failed > 0 || cheapest == nil || p.Policy == cheapest.Policy {
			continue
		}
		out = append(out, fmt.Sprintf("  against %s: $%.2f, %.1f images per request, %d prefix breaks.", p.Policy, p.Dollars, p.ImagesMean, p.PrefixBreaks))
	}
	return out
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func percent(f float64) string {
	if math.IsNaN(f) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*f)
}

// palette gives each policy a line colour and dash in the SVG.
var palette = map[string]struct{ color, dash string }{
	"naive": {"#999999", "2,3"}, "ephemeral": {"#1f77b4", ""}, "newest-n": {"#d62728", ""},
	"ceiling-batch": {"#ff7f0e", "6,3"}, "strip-on-compact": {"#9467bd", "6,3"}, "imgctx": {"#2ca02c", ""},
}

// WriteSVG draws two charts, one above the other, against the workload's
// steps: the cumulative cost, and the size of each step's prompt (the
// window drawn across), one line per policy, with a legend.
func (r *Report) WriteSVG(w io.Writer) error {
	const width, chartH, left, right, top = 940, 260, 80, 210, 40
	height := top + 2*chartH + 110
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15" font-weight="bold">%s on %s: %d steps, %d images</text>`+"\n",
		left, esc(r.Workload), esc(r.Model), r.Steps, r.Occurrences)
	charts := []struct {
		title string
		value func(Point) float64
		unit  func(float64) string
	}{
		{"cumulative cost (USD)", func(p Point) float64 { return p.Dollars }, func(v float64) string { return fmt.Sprintf("$%.2f", v) }},
		{"prompt size of each step (tokens; failed requests included)", func(p Point) float64 { return float64(p.Context) },
			func(v float64) string { return thousands(int64(v)) }},
	}
	for c, ch := range charts {
		y0 := top + c*(chartH+60)
		plotW, plotH := width-left-right, chartH-30
		maxV := 0.0
		for _, p := range r.Policies {
			for _, pt := range p.Series {
				maxV = max(maxV, ch.value(pt))
			}
		}
		if maxV == 0 {
			maxV = 1
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", left, y0+12, esc(ch.title))
		base := y0 + 20 + plotH
		for i := 0; i <= 4; i++ {
			v := maxV * float64(i) / 4
			y := float64(base) - float64(plotH)*float64(i)/4
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
				left, left+plotW, y, y, left-6, y+4, ch.unit(v))
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left+plotW, base, base)
		for i := 0; i <= 4; i++ {
			x := float64(left) + float64(plotW)*float64(i)/4
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x, base+15, r.Steps*i/4)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">step</text>`+"\n", left+plotW, base+30)
		if c == 1 && r.Window > 0 && float64(r.Window) <= maxV {
			y := float64(base) - float64(plotH)*float64(r.Window)/maxV
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="1,3"/><text x="%d" y="%.1f">window %s</text>`+"\n",
				left, left+plotW, y, y, left+4, y-4, thousands(int64(r.Window)))
		}
		for _, p := range r.Policies {
			st := palette[p.Policy]
			var pts []string
			for i, pt := range p.Series {
				x := float64(left) + float64(plotW)*float64(i)/float64(max(len(p.Series)-1, 1))
				y := float64(base) - float64(plotH)*ch.value(pt)/maxV
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			}
			dash := ""
			if st.dash != "" {
				dash = fmt.Sprintf(` stroke-dasharray="%s"`, st.dash)
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`+"\n", st.color, dash, strings.Join(pts, " "))
		}
	}
	for i, p := range r.Policies {
		st := palette[p.Policy]
		y := top + 30 + i*20
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s $%.2f</text>`+"\n",
			width-right+10, width-right+34, y, y, st.color, width-right+40, y+4, esc(p.Policy), p.Dollars)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
