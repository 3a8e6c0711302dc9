package engine

import (
	"testing"
	"time"

	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
)

// sonnetPrices are Claude Sonnet's list prices: holding images is priced.
var sonnetPrices = tokens.Prices{Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75, CacheWrite1h: 6}

// The sessions API holds as the proxy does (KeepConfig.Hold, a cache that
// bills writes): screenshots over the budget stay kept while the cache is
// warm, and the first turn that starts with it cold applies the budget in
// one batch. Without Hold the budget applies as each image is measured.
func TestHoldKeepsOverTheBudgetUntilTheCacheIsCold(t *testing.T) {
	for _, hold := range []bool{true, false} {
		const window = 15000 // keep budget 1,500: room for one 1,334-token screenshot
		r := newRig(t, upstream.Anthropic, window)
		r.up.profile.Cache.Breakpoints = 4 // Anthropic's cache, which bills writes
		r.up.profile.Prices = &sonnetPrices
		r.engine = r.open(t)
		now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
		r.engine.Now = func() time.Time { return now }
		r.engine.Keep.Hold, r.engine.Keep.Sight = hold, policy.DefaultSight
		id := r.session(t, true)
		for i := range 3 {
			r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: "ok"})
			turn(t, r, id, "look", screenshot(1280, 800, uint8(40+i)))
			now = now.Add(30 * time.Second)
		}
		kept := len(keptImages(r.live(t, id).Live))
		if hold && kept != 3 || !hold && kept != 1 {
			t.Fatalf("hold %v: %d kept after three warm turns; want %d", hold, kept, map[bool]int{true: 3, false: 1}[hold])
		}
		if !hold {
			continue
		}
		now = now.Add(10 * time.Minute) // past the cache TTL
		r.up.replies = append(r.up.replies, reply{text: "back"})
		r.call(t, id, user("still there?"))
		if n := len(keptImages(r.live(t, id).Live)); n != 0 || !hasEvent(r.events, "removed", "priced") {
			t.Fatalf("cold turn start: %d still kept; want them removed by price (a cold cache: the break is free) in one batch", n)
		}
	}
}

// Past the provider's image count the oldest kept images leave in one
// batch, down to the low-water mark of the limit (a tenth by default: so
// the next batch is far off), as on the proxy path.
func TestImageLimitEvictsInOneBatch(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 200_000)
	r.up.profile.Limits.MaxImages = 4
	r.engine = r.open(t)
	id := r.session(t, true)
	var counts []int
	for i := range 7 {
		r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: "ok"})
		turn(t, r, id, "look", screenshot(1280, 800, uint8(60+i)))
		counts = append(counts, r.up.imageTokens[len(r.up.imageTokens)-1]/1334)
	}
	drops, removed := 0, 0
	for i, n := range counts {
		if n > 4 {
			t.Fatalf("request with %d images; the limit is 4 (%v)", n, counts)
		}
		if i > 0 && n < counts[i-1] {
			drops++
		}
	}
	for _, e := range r.events {
		if e.Kind == "removed" && e.Reason == "provider_limit" {
			removed++
		}
	}
	if drops != 1 || removed != 4 {
		t.Fatalf("images per request %v, %d removed for the limit: want one batch of the 4 kept (5 images down to the turn's own)", counts, removed)
	}
}

// Images before summaries: when taking the kept images out alone brings a
// request under the threshold, no summary is made — with the cache warm
// (where a cache-sharing summary would otherwise run on the intact
// prefix) as with it cold.
func TestKeptImagesGoBeforeAnySummary(t *testing.T) {
	for _, warm := range []bool{true, false} {
		const window = 15000 // keep budget 1,500; held images go past it
		r := newRig(t, upstream.Anthropic, window)
		r.up.profile.Cache.Breakpoints = 4
		r.up.profile.Prices = &sonnetPrices
		r.engine = r.open(t)
		now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
		r.engine.Now = func() time.Time { return now }
		r.engine.Keep.Hold, r.engine.Keep.Sight = true, policy.DefaultSight
		r.engine.KeepLowWater = 0.5
		id := r.session(t, true)
		for i := range 4 {
			r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: "ok"})
			turn(t, r, id, "look", screenshot(1280, 800, uint8(80+i)))
			now = now.Add(30 * time.Second)
		}
		if n := len(keptImages(r.live(t, id).Live)); n != 4 {
			t.Fatalf("%d kept; want the 4 held", n)
		}
		if !warm {
			now = now.Add(10 * time.Minute)
		}
		// Over the threshold by ~5,000 tokens: only all four kept images
		// out (5,336) bring the request under it.
		last := r.up.prompts[len(r.up.prompts)-1]
		r.engine.CompactThreshold = float64(last-4990) / window
		r.up.replies = append(r.up.replies, reply{text: "fine"})
		r.call(t, id, user("and now?"))
		if len(r.up.summaries) != 0 {
			t.Fatalf("warm %v: a summary was made although removing the kept images was enough", warm)
		}
		if sent := r.up.prompts[len(r.up.prompts)-1]; sent > int(r.engine.CompactThreshold*window) {
			t.Fatalf("warm %v: the request carried %d tokens, over the threshold %d", warm, sent, int(r.engine.CompactThreshold*window))
		}
	}
}
