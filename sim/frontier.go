package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/imgctx/imgctx/tokens"
)

// Frontier is the hindsight limit of a workload on one provider: for each
// level of images shown, the cheapest schedule of image removals knowing
// the whole future — which requests remove, and how many of the oldest
// images each removes, in one batch or several — under the same window,
// image, byte and cache rules. No online policy that removes oldest first
// can beat it; the report measures each policy's distance to it.
//
// It is computed by dynamic programming over (request, images removed so
// far), exact for the cost model in trace.cost, once for each price put on
// showing an image (a Lagrange sweep): the points are the lower convex
// hull of cost against images per request.
type Frontier struct {
	Points []FrontierPoint `json:"points"`
	// Assumes says what the model leaves out.
	Assumes string `json:"assumes"`
}

// FrontierPoint is one schedule on the frontier.
type FrontierPoint struct {
	Images   float64 `json:"images_per_request_mean"`
	Dollars  float64 `json:"dollars"`
	Batches  int     `json:"removal_batches"`
	Schedule []int   `json:"-"` // images removed after each step's request, oldest first
}

// CostAt is the frontier's cost at images per request: interpolated on
// the hull; at or below its cheapest point, that point's cost. ok is
// false past its largest point.
func (f *Frontier) CostAt(images float64) (float64, bool) {
	ps := f.Points
	if len(ps) == 0 || images > ps[len(ps)-1].Images+1e-9 {
		return 0, false
	}
	if images <= ps[0].Images {
		return ps[0].Dollars, true
	}
	for i := 1; i < len(ps); i++ {
		a, b := ps[i-1], ps[i]
		if images <= b.Images {
			if b.Images == a.Images {
				return min(a.Dollars, b.Dollars), true
			}
			return a.Dollars + (b.Dollars-a.Dollars)*(images-a.Images)/(b.Images-a.Images), true
		}
	}
	return ps[len(ps)-1].Dollars, true
}

// trace is a workload reduced to what removals change: the blocks of the
// whole history as the provider counts them, with and without their
// images, and where each request ends.
type trace struct {
	prof      tokens.Profile
	api       string
	kept      []int // prefix sums of block tokens, images kept (len blocks+1)
	items     []item
	end       []int           // blocks in each step's request
	at        []time.Duration // each step's time
	counted   []bool          // the step counts for images per request (an image was seen)
	textBytes []int           // each request's bytes without its images
	pages     []int           // PDF pages in each request
	sysEnd    int             // blocks up to and including the system breakpoint
	output    int             // output tokens a request
}

// item is one block that carries images, in order.
type item struct {
	pos         int // block index
	saved       int // tokens its images cost over the placeholder's
	images      int
	bytes, edge int
}

// HindsightFrontier computes the frontier of a workload on a profile.
func HindsightFrontier(w *Workload, prof tokens.Profile) (*Frontier, error) {
	t, err := newTrace(w, prof)
	if err != nil {
		return nil, err
	}
	return t.frontier(), nil
}

func newTrace(w *Workload, prof tokens.Profile) (*trace, error) {
	api, err := Format(prof)
	if err != nil {
		return nil, err
	}
	var all []Msg
	tr := &trace{prof: prof, api: api, output: 120}
	p := NewProvider(prof, NewClock(), nil)
	var now time.Duration
	seen := false
	for _, st := range w.Steps {
		if st.Reset {
			return nil, fmt.Errorf("the recording restarts its history (a client that compacted): no single schedule covers it")
		}
		all = append(all, st.Add...)
		now += st.Think
		body := render(api, prof.Name, w.System, w.Tools, all, true)
		bs, err := p.blocks(api, body)
		if err != nil {
			return nil, err
		}
		pages := 0
		for _, b := range bs {
			pages += b.pages
		}
		for _, m := range st.Add {
			seen = seen || hasImage(m)
		}
		tr.end = append(tr.end, len(bs))
		tr.at = append(tr.at, now)
		tr.counted = append(tr.counted, seen)
		tr.textBytes = append(tr.textBytes, len(body))
		tr.pages = append(tr.pages, pages)
	}
	p.prev = nil
	kept, err := p.blocks(api, render(api, prof.Name, w.System, w.Tools, all, false))
	if err != nil {
		return nil, err
	}
	removed := cloneMsgs(all)
	for i := range removed {
		for j := range removed[i].Parts {
			part := &removed[i].Parts[j]
			if part.Result != nil {
				for k, in := range part.Result.Parts {
					if in.Image != nil && in.Image.Pages == 0 {
						part.Result.Parts[k] = Part{Removed: "hindsight"}
					}
				}
			} else if part.Image != nil && part.Image.Pages == 0 {
				*part = Part{Removed: "hindsight"}
			}
		}
	}
	p.prev = nil
	without, err := p.blocks(api, render(api, prof.Name, w.System, w.Tools, removed, false))
	if err != nil {
		return nil, err
	}
	if len(kept) != len(without) || len(kept) != tr.end[len(tr.end)-1] {
		return nil, fmt.Errorf("the history's blocks change with its images (%d, %d, %d)", len(kept), len(without), tr.end[len(tr.end)-1])
	}
	tr.kept = make([]int, len(kept)+1)
	for i, b := range kept {
		tr.kept[i+1] = tr.kept[i] + b.tokens
		if b.images > 0 {
			tr.items = append(tr.items, item{pos: i, saved: b.tokens - without[i].tokens, images: b.images, bytes: b.size, edge: b.edge})
		}
		if b.bp && tr.sysEnd == 0 {
			tr.sysEnd = i + 1
		}
	}
	return tr, nil
}

// arrived is the number of items in the first end blocks.
func (t *trace) arrived(end int) int {
	n, _ := slices.BinarySearchFunc(t.items, end, func(it item, e int) int { return it.pos - e })
	return n
}

// sums are prefix sums over the items, so a request's cost is O(1).
type sums struct {
	saved, images, bytes, wide []int
}

func (t *trace) sums() sums {
	n := len(t.items)
	s := sums{make([]int, n+1), make([]int, n+1), make([]int, n+1), make([]int, n+1)}
	for i, it := range t.items {
		s.saved[i+1] = s.saved[i] + it.saved
		s.images[i+1] = s.images[i] + it.images
		s.bytes[i+1] = s.bytes[i] + it.bytes
		wide := 0
		if lim := t.prof.Limits.ManyImagesMaxEdge; lim > 0 && it.edge > lim {
			wide = 1
		}
		s.wide[i+1] = s.wide[i] + wide
	}
	return s
}

// prompt is the tokens of the first end blocks with the k oldest items'
// images removed.
func (t *trace) prompt(s sums, end, k int) int {
	return t.kept[end] - s.saved[min(k, t.arrived(end))]
}

// cost is what the provider bills step i's request when the k oldest
// items are removed, prev of them by the previous request: +Inf when the
// provider would refuse it. The model: a warm cache (the previous request
// less than the TTL ago) reads the previous request's prompt when the
// removal leaves it whole (Anthropic: its last breakpoint within the
// 20-block look-back), else the prefix before the first removed image
// (automatic prefix caching) or the system breakpoint (Anthropic); what
// follows is written (Anthropic) or billed as input.
func (t *trace) cost(s sums, i, prev, k int) (float64, int) {
	end := t.end[i]
	n := t.arrived(end)
	shown := s.images[n] - s.images[k]
	lim := t.prof.Limits
	P := t.prompt(s, end, k)
	switch {
	case P > t.prof.ContextWindow,
		lim.MaxImages > 0 && shown+t.pages[i] > lim.MaxImages,
		lim.ManyImagesAbove > 0 && shown > lim.ManyImagesAbove && s.wide[n]-s.wide[k] > 0,
		lim.MaxRequestBytes > 0 && int64(t.textBytes[i]+s.bytes[n]-s.bytes[k]) > lim.MaxRequestBytes:
		return math.Inf(1), shown
	}
	pr := *t.prof.Prices
	minTok := t.prof.Cache.MinTokens
	ttl := t.prof.Cache.TTL
	if ttl <= 0 || t.api == "gemini" {
		ttl = 5 * time.Minute
	}
	warm := i > 0 && t.at[i]-t.at[i-1] < ttl
	read := 0
	if warm {
		last := t.end[i-1] // blocks the previous request had
		brk := last        // the first block that changed
		if k > prev {
			brk = min(t.items[prev].pos, last) // an image removed as it arrives changes nothing sent before
		}
		if t.api == "anthropic" {
			prevP := t.prompt(s, last, prev)
			switch {
			case brk >= last && end-last <= 20 && prevP >= minTok:
				read = t.prompt(s, last, k)
			case t.sysEnd > 0 && t.kept[t.sysEnd] >= minTok:
				read = t.kept[t.sysEnd]
			}
		} else {
			read = t.prompt(s, brk, k)
			if inc := t.prof.Cache.Increment; inc > 0 {
				read = read / inc * inc
			}
			if P < minTok || read < minTok {
				read = 0
			}
		}
	}
	out := float64(t.output) * pr.Output
	if t.api == "anthropic" {
		if P < minTok { // nothing written: all input
			return (float64(read)*pr.CacheRead + float64(P-read)*pr.Input + out) / 1e6, shown
		}
		return (float64(read)*pr.CacheRead + float64(P-read)*pr.CacheWrite + out) / 1e6, shown
	}
	return (float64(read)*pr.CacheRead + float64(P-read)*pr.Input + out) / 1e6, shown
}

// best is the schedule minimising cost − lambda × images shown (in counted
// requests), and its cost, images shown and value.
func (t *trace) best(s sums, lambda float64) (schedule []int, dollars float64, shown int, value float64) {
	steps := len(t.end)
	K := len(t.items)
	inf := math.Inf(1)
	v := make([]float64, K+1)
	for k := range v {
		v[k] = inf
	}
	back := make([][]int32, steps)
	next := make([]float64, K+1)
	for i := range steps {
		n := t.arrived(t.end[i])
		back[i] = make([]int32, n+1)
		for k := range next {
			next[k] = inf
		}
		for k := 0; k <= n; k++ {
			from, to := 0, k
			if i == 0 {
				to = 0
			}
			for prev := from; prev <= to; prev++ {
				base := 0.0
				if i > 0 {
					base = v[prev]
				}
				if math.IsInf(base, 1) {
					continue
				}
				c, sh := t.cost(s, i, prev, k)
				if t.counted[i] {
					c -= lambda * float64(sh)
				}
				if base+c < next[k] {
					next[k], back[i][k] = base+c, int32(prev)
				}
			}
		}
		v, next = next, v
	}
	bestK, bestV := -1, inf
	for k, x := range v {
		if x < bestV {
			bestK, bestV = k, x
		}
	}
	if bestK < 0 {
		return nil, inf, 0, inf
	}
	schedule = make([]int, steps)
	k := bestK
	for i := steps - 1; i >= 0; i-- {
		schedule[i] = k
		k = int(back[i][k])
	}
	dollars, shown = t.price(s, schedule)
	return schedule, dollars, shown, bestV
}

// price is a schedule's cost and images shown in counted requests.
func (t *trace) price(s sums, schedule []int) (float64, int) {
	total, shown := 0.0, 0
	prev := 0
	for i, k := range schedule {
		c, sh := t.cost(s, i, prev, k)
		total += c
		if t.counted[i] {
			shown += sh
		}
		prev = k
	}
	return total, shown
}

func (t *trace) frontier() *Frontier {
	s := t.sums()
	counted := 0
	for _, c := range t.counted {
		if c {
			counted++
		}
	}
	f := &Frontier{Assumes: "oldest-first removals; Anthropic reads only the previous request's prompt or the system breakpoint after a removal; " +
		"no compaction (the history's text fits the window); OpenAI's one-hour retention not modelled"}
	if counted == 0 || len(t.items) == 0 {
		return f
	}
	// What one image costs a request at the input price: the scale of the
	// prices put on showing one.
	perImage := float64(s.saved[len(t.items)]) / float64(len(t.items)) * t.prof.Prices.Input / 1e6
	lambdas := []float64{0}
	for x := 0.01; x <= 100; x *= 1.5 {
		lambdas = append(lambdas, x*perImage)
	}
	lambdas = append(lambdas, 1e3*perImage)
	for _, l := range lambdas {
		sched, dollars, shown, _ := t.best(s, l)
		if sched == nil {
			continue
		}
		batches, prev := 0, 0
		for _, k := range sched {
			if k > prev {
				batches++
			}
			prev = k
		}
		f.Points = append(f.Points, FrontierPoint{Images: float64(shown) / float64(counted), Dollars: dollars, Batches: batches, Schedule: sched})
	}
	// The lower hull, by images ascending.
	slices.SortFunc(f.Points, func(a, b FrontierPoint) int {
		if a.Images != b.Images {
			return cmp.Compare(a.Images, b.Images)
		}
		return cmp.Compare(a.Dollars, b.Dollars)
	})
	var hull []FrontierPoint
	for _, p := range f.Points {
		if len(hull) > 0 && p.Images-hull[len(hull)-1].Images < 1e-9 {
			continue
		}
		if len(hull) > 0 && p.Dollars < hull[len(hull)-1].Dollars {
			// More images for less: the cheaper points before it are dominated.
			for len(hull) > 0 && hull[len(hull)-1].Dollars >= p.Dollars {
				hull = hull[:len(hull)-1]
			}
		}
		hull = append(hull, p)
	}
	f.Points = hull
	return f
}
