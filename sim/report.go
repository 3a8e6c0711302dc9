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
	fmt.Fprintf(w, "%s\n\n", r.title())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, cells := range r.rows() {
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	tw.Flush()
	if f := r.Frontier; f != nil && len(f.Points) > 0 {
		fmt.Fprintf(w, "\nhindsight frontier (%s; a distance in parentheses is a row's that failed requests, which are not billed):\n", f.Assumes)
		for _, p := range f.Points {
			fmt.Fprintf(w, "  %6.1f images per request: $%.2f (%d removal batches)\n", p.Images, p.Dollars, p.Batches)
		}
	}
	fmt.Fprintln(w)
	for _, line := range r.Notes {
		fmt.Fprintln(w, line)
	}
}

func (r *Report) title() string {
	return fmt.Sprintf("imgctx simulate: %s on %s (profile %s, %s wire): %d steps, %d distinct images in %d attachments, %s bytes an image on average",
		r.Workload, r.Model, r.Profile, r.Format, r.Steps, r.Images, r.Occurrences, thousands(r.ImageBytes))
}

// rows are the table: a header row of the policies, then one row a
// measure, its name first.
func (r *Report) rows() [][]string {
	var out [][]string
	row := func(name string, f func(p PolicyReport) string) {
		cells := []string{name}
		for _, p := range r.Policies {
			cells = append(cells, f(p))
		}
		out = append(out, cells)
	}
	row("", func(p PolicyReport) string { return p.Policy })
	row("requests", func(p PolicyReport) string { return fmt.Sprint(p.Requests) })
	row("failed (window, image limit)", func(p PolicyReport) string { return fmt.Sprint(p.Failed) })
	row("compactions", func(p PolicyReport) string { return fmt.Sprint(p.Compactions) })
	row("  on a refusal", func(p PolicyReport) string { return fmt.Sprint(p.Recovered) })
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
		switch {
		case p.FrontierGap == nil:
			return "n/a"
		case p.Failed > 0:
			return fmt.Sprintf("(%+.0f%%)", 100**p.FrontierGap) // refused requests are not billed
		}
		return fmt.Sprintf("%+.0f%%", 100**p.FrontierGap)
	})
	row("largest request (bytes)", func(p PolicyReport) string { return thousands(int64(p.LargestRequest)) })
	row("request bytes, all requests", func(p PolicyReport) string { return thousands(p.BytesSent) })
	row("  per request, mean", func(p PolicyReport) string { return thousands(p.BytesSent / int64(max(p.Requests, 1))) })
	row("file upload bytes", func(p PolicyReport) string { return thousands(p.BytesUploaded) })
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
	return out
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
	return append(out, r.losses(ours)...)
}

// losses says where imgctx loses: the peers that show as many images for
// no more than its default, and those no imgctx row (the default or a
// position of the dial) does as well as.
func (r *Report) losses(ours *PolicyReport) []string {
	say := func(ps []PolicyReport) string {
		var s []string
		for _, p := range ps {
			s = append(s, fmt.Sprintf("%s ($%.2f, %.1f images per request)", p.Policy, p.Dollars, p.ImagesMean))
		}
		return strings.Join(s, ", ")
	}
	over, unmatched := r.Losses()
	var out []string
	if len(over) > 0 {
		out = append(out, "imgctx's default is dominated: "+say(over)+" shows as many images for no more.")
	}
	if len(unmatched) > 0 {
		out = append(out, "No imgctx row run here shows as many images for no more than "+say(unmatched)+".")
	}
	return out
}

// Losses returns the peers (rows with no refused request) that dominate
// imgctx's default (Dominates) — in front of the claude-code-like agent,
// or in front of the peer's own agent where that row was run (NaiveImgctx,
// imgctx@opencode) — and those that no imgctx row — a default or a
// position of the dial — does as well as (judges).
func (r *Report) Losses() (over, unmatched []PolicyReport) {
	for _, p := range r.Policies {
		if strings.HasPrefix(p.Policy, "imgctx") || p.Failed > 0 {
			continue
		}
		dominated, matched := false, false
		for _, q := range r.Policies {
			if !strings.HasPrefix(q.Policy, "imgctx") || !judges(q, p) {
				continue
			}
			// A default (Fronts): judges leaves the one in front of the
			// claude-code-like agent and the one in front of the peer's own.
			dominated = dominated || slices.Contains(Fronts, q.Policy) && Dominates(p, q)
			// A +recall row's model asks for images back: not the peers'
			// workload, so it matches none of them.
			matched = matched || !strings.HasSuffix(q.Policy, "+recall") && q.Failed == 0 && AtLeastAsGood(q, p)
		}
		if dominated {
			over = append(over, p)
		}
		if !matched {
			unmatched = append(unmatched, p)
		}
	}
	return over, unmatched
}

// judges reports whether imgctx's row q may judge peer p. In front of the
// claude-code-like agent it judges every peer; in front of another agent
// (NaiveImgctx, imgctx@opencode) only the peers whose agents compact as
// that one does (never, or opencode's way): against the others it would
// keep what their compaction takes away, or lose what it keeps. A user of
// opencode asks what imgctx in front of opencode gives them.
func judges(q, p PolicyReport) bool { return q.Compacts == "shared" || q.Compacts == p.Compacts }

// Dominates reports whether row a is at least as good as b and better in
// one respect: more images per request, or a cost more than 1% lower. Two
// rows alike (every policy's, where only the user's images are shown and
// the agent compacts them away) do not dominate each other.
func Dominates(a, b PolicyReport) bool {
	return AtLeastAsGood(a, b) && (a.ImagesMean > b.ImagesMean+1e-9 || a.Dollars < b.Dollars*0.99)
}

// AtLeastAsGood reports whether row a shows at least as many images per
// request as b at no higher cost, a cost within 1% counting as no higher.
func AtLeastAsGood(a, b PolicyReport) bool {
	return a.ImagesMean >= b.ImagesMean && a.Dollars <= b.Dollars*1.01
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

// style is how a policy is drawn: a colour and a dash, distinct for each
// family so rows that overlap stay visible.
type style struct{ color, dash string }

var palette = map[string]style{
	"naive": {"#999999", "2,3"}, "newest": {"#d62728", ""}, "ref-loop": {"#8c564b", ""}, "ref-loop-cached": {"#8c564b", "6,3"},
	"chunked": {"#17becf", ""}, "osworld": {"#bcbd22", "4,2"}, "ceiling-batch": {"#ff7f0e", "6,3"}, "strip-on-compact": {"#9467bd", "6,3"},
	"ephemeral": {"#1f77b4", "1,2"}, "imgctx": {"#2ca02c", ""}, NaiveImgctx: {"#2ca02c", "2,3"},
}

// styleOf finds a row's style by its name or its name without parameters
// ("chunked" for "chunked-3/10").
func styleOf(policy string) style {
	if st, ok := palette[policy]; ok {
		return st
	}
	for i := len(policy) - 1; i > 0; i-- {
		if policy[i] == '-' && i+1 < len(policy) && policy[i+1] >= '0' && policy[i+1] <= '9' {
			if st, ok := palette[policy[:i]]; ok {
				return st
			}
		}
	}
	return style{"#444444", "3,1,1,1"}
}

// niceTicks returns round tick values from 0 past max: steps of 1, 2, 2.5
// or 5 times a power of ten, about n of them.
func niceTicks(maxV float64, n int) []float64 {
	if maxV <= 0 {
		maxV = 1
	}
	raw := maxV / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag * 10
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := 0.0; ; v += step {
		out = append(out, v)
		if v >= maxV-1e-12 {
			return out
		}
	}
}

// plot is one chart's frame: data ranges mapped onto its pixels.
type plot struct {
	b            *strings.Builder
	x0, y0, w, h float64 // the plotting area's top left and size
	xMax, yMax   float64
	xUnit, yUnit func(float64) string
	xTitle, head string
}

func (p *plot) x(v float64) float64 { return p.x0 + p.w*v/p.xMax }
func (p *plot) y(v float64) float64 { return p.y0 + p.h - p.h*v/p.yMax }

// frame draws the title, round ticks on both axes and their grid, and
// leaves xMax, yMax at the last ticks.
func (p *plot) frame() {
	xs, ys := niceTicks(p.xMax, 5), niceTicks(p.yMax, 4)
	p.xMax, p.yMax = xs[len(xs)-1], ys[len(ys)-1]
	fmt.Fprintf(p.b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", p.x0, p.y0-10, esc(p.head))
	for _, v := range ys {
		fmt.Fprintf(p.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			p.x0, p.x0+p.w, p.y(v), p.y(v), p.x0-6, p.y(v)+4, p.yUnit(v))
	}
	for _, v := range xs {
		fmt.Fprintf(p.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#f0f0f0"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
			p.x(v), p.x(v), p.y0, p.y0+p.h, p.x(v), p.y0+p.h+15, p.xUnit(v))
	}
	fmt.Fprintf(p.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", p.x0, p.x0+p.w, p.y0+p.h, p.y0+p.h)
	fmt.Fprintf(p.b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", p.x0+p.w, p.y0+p.h+30, esc(p.xTitle))
}

func dashAttr(st style) string {
	if st.dash == "" {
		return ""
	}
	return fmt.Sprintf(` stroke-dasharray="%s"`, st.dash)
}

// WriteSVG draws the trade-off and how it came about: cost against images
// per request (the hindsight frontier a line) and against the share of the
// last 10 screenshots visible, every policy a point, a hollow one when it
// failed requests; then the cumulative cost and each step's prompt size
// against the steps, one line per policy, failed steps marked ×.
func (r *Report) WriteSVG(w io.Writer) error {
	const width, left, right, top, gap = 1040, 80, 230, 50, 70
	const scatterH, lineH = 260, 220
	plotW := float64(width - left - right)
	height := top + scatterH + 2*(lineH+gap) + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15" font-weight="bold">%s on %s: %d steps, %d images</text>`+"\n",
		left, esc(r.Workload), esc(r.Model), r.Steps, r.Occurrences)
	dollars := func(v float64) string { return fmt.Sprintf("$%.2f", v) }
	maxCost, maxImages := 0.0, 0.0
	for _, p := range r.Policies {
		maxCost, maxImages = max(maxCost, p.Dollars), max(maxImages, p.ImagesMean)
	}
	if r.Frontier != nil {
		for _, pt := range r.Frontier.Points {
			maxImages = max(maxImages, pt.Images)
		}
	}
	half := (plotW - 60) / 2
	scatters := []struct {
		p   plot
		x   func(PolicyReport) float64
		hul bool
	}{
		{plot{x0: left, w: half, xMax: maxImages, xTitle: "images per request (mean)", head: "cost against images per request",
			xUnit: func(v float64) string { return fmt.Sprintf("%g", v) }}, func(p PolicyReport) float64 { return p.ImagesMean }, true},
		{plot{x0: left + half + 60, w: half, xMax: 1, xTitle: "last 10 screenshots visible", head: "cost against recency",
			xUnit: func(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }}, func(p PolicyReport) float64 { return p.Recency }, false},
	}
	for _, sc := range scatters {
		p := sc.p
		p.b, p.y0, p.h, p.yMax, p.yUnit = &b, top+20, scatterH-50, maxCost, dollars
		p.frame()
		if sc.hul && r.Frontier != nil && len(r.Frontier.Points) > 0 {
			var pts []string
			for _, fp := range r.Frontier.Points {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", p.x(fp.Images), p.y(min(fp.Dollars, p.yMax))))
			}
			fmt.Fprintf(&b, `<polyline class="frontier" fill="none" stroke="#000" stroke-width="1.2" stroke-dasharray="5,3" points="%s"/>`+"\n", strings.Join(pts, " "))
			last := r.Frontier.Points[len(r.Frontier.Points)-1]
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="end">hindsight frontier</text>`+"\n", p.x(last.Images)-4, p.y(min(last.Dollars, p.yMax))-6)
		}
		var taken [][2]float64 // labels placed: a later one that would cover one moves down
		for _, pr := range r.Policies {
			if math.IsNaN(sc.x(pr)) {
				continue // no screenshot to be recent
			}
			st := styleOf(pr.Policy)
			cx, cy := p.x(sc.x(pr)), p.y(pr.Dollars)
			fill := st.color
			label := pr.Policy
			if pr.Failed > 0 {
				fill = "white"
				label = fmt.Sprintf("%s (%d failed)", pr.Policy, pr.Failed)
			}
			lx, ly := cx+7, cy-6
			for _, dy := range []float64{-6, -17, 14, -28, 25, -39, 36} {
				free := true
				for _, t := range taken {
					free = free && (math.Abs(t[0]-lx) >= 70 || math.Abs(t[1]-(cy+dy)) >= 11)
				}
				if free {
					ly = cy + dy
					break
				}
			}
			taken = append(taken, [2]float64{lx, ly})
			fmt.Fprintf(&b, `<circle class="policy" cx="%.1f" cy="%.1f" r="5" fill="%s" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f" font-size="10">%s</text>`+"\n",
				cx, cy, fill, st.color, lx, ly, esc(label))
		}
	}
	lines := []struct {
		head  string
		value func(Point) float64
		unit  func(float64) string
	}{
		{"cumulative cost (USD)", func(p Point) float64 { return p.Dollars }, dollars},
		{"prompt size of each step (tokens; failed requests included)", func(p Point) float64 { return float64(p.Context) },
			func(v float64) string { return thousands(int64(v)) }},
	}
	for c, ch := range lines {
		p := plot{b: &b, x0: left, y0: float64(top + scatterH + gap + c*(lineH+gap)), w: plotW, h: lineH - 40, xMax: float64(max(r.Steps, 1)),
			xTitle: "step", head: ch.head, yUnit: ch.unit, xUnit: func(v float64) string { return fmt.Sprintf("%.0f", v) }}
		for _, pr := range r.Policies {
			for _, pt := range pr.Series {
				p.yMax = max(p.yMax, ch.value(pt))
			}
		}
		if c == 1 && r.Window > 0 {
			p.yMax = max(p.yMax, float64(r.Window))
		}
		p.frame()
		if c == 1 && r.Window > 0 {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="1,3"/><text x="%.1f" y="%.1f">window %s</text>`+"\n",
				p.x0, p.x0+p.w, p.y(float64(r.Window)), p.y(float64(r.Window)), p.x0+4, p.y(float64(r.Window))-4, thousands(int64(r.Window)))
		}
		for _, pr := range r.Policies {
			st := styleOf(pr.Policy)
			var pts, fails []string
			for i, pt := range pr.Series {
				x, y := p.x(float64(i+1)), p.y(ch.value(pt))
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
				if pt.Failed {
					fails = append(fails, fmt.Sprintf("M%.1f,%.1fl6,6m0,-6l-6,6", x-3, y-3))
				}
			}
			width := 1.6
			if pr.Policy == "imgctx" {
				width = 2.6
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n", st.color, width, dashAttr(st), strings.Join(pts, " "))
			if len(fails) > 0 {
				fmt.Fprintf(&b, `<path class="failed" d="%s" stroke="%s" stroke-width="1.4" fill="none"/>`+"\n", strings.Join(fails, ""), st.color)
			}
		}
	}
	for i, p := range r.Policies {
		st := styleOf(p.Policy)
		y := top + scatterH + gap + i*34
		failed := ""
		if p.Failed > 0 {
			failed = fmt.Sprintf(", %d failed", p.Failed)
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"%s/><text x="%d" y="%d">%s</text><text x="%d" y="%d" font-size="10">$%.2f, %.1f img/request%s</text>`+"\n",
			width-right+10, width-right+34, y, y, st.color, dashAttr(st), width-right+40, y+4, esc(p.Policy), width-right+40, y+17, p.Dollars, p.ImagesMean, failed)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
