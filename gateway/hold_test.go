package gateway

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
)

// settableClock is a test clock the rig's engine reads.
type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settableClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *settableClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func holdRig(t *testing.T, window int) (*agentRig, *settableClock) {
	clock := &settableClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	rig := newAgentRig(t, window, &session.Mem{})
	rig.hold, rig.clock = true, clock.now
	rig.restart(t)
	return rig, clock
}

// KeepConfig.Hold at the default sight: tool images over the budget stay
// while the provider caches the conversation, so the next turn's body
// begins with the whole previous one (no prefix break); a turn that starts
// with the cache cold removes them by price (the break is free) in one
// batch.
func TestProxyHoldKeepsImagesWhileTheCacheIsWarm(t *testing.T) {
	rig, clock := holdRig(t, 20_000) // budget 2,000: one screenshot
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	for range 3 {
		g.results(1, false, false)
		g.send(reply{tools: 1})
	}
	g.results(1, false, false)
	g.send(reply{})
	clock.advance(30 * time.Second)
	g.human("And now?")
	g.send(reply{})
	prev, next := g.sent[len(g.sent)-2], g.sent[len(g.sent)-1]
	if n := bytes.Count(next, []byte(`"type":"image"`)); n != 4 {
		t.Fatalf("warm cache: %d screenshots sent at the next turn; want all 4 held", n)
	}
	if !bytes.HasPrefix(next, prev[:len(prev)-2]) {
		t.Fatal("warm cache: the next turn's body does not begin with the previous one: the prefix broke")
	}
	if n := rig.counter("removed", "budget"); n != 0 {
		t.Fatalf("%d removed for the budget while warm", n)
	}
	clock.advance(10 * time.Minute) // past keep.cache_ttl: the provider's cache is gone
	g.human("Back after a break.")
	g.send(reply{})
	last := g.sent[len(g.sent)-1]
	if n := bytes.Count(last, []byte(`"type":"image"`)); n != 0 || rig.counter("removed", "priced") != 4 {
		t.Fatalf("cold cache: %d screenshots still sent, %d removed; want all 4 removed by price in one batch", n, rig.counter("removed", "priced"))
	}
}

// At a low sight the price decides while the cache is warm: holding the
// earlier turns' screenshots is paid request by request, and once it has
// paid one prefix break they all leave in one batch (reason priced) — the
// current turn's screenshots stay, and no other request removes any. The
// human's long messages make a break dear (Anthropic rewrites from the
// start): the batch waits for several turns of holding, where a short
// conversation removes at each turn.
func TestProxyLowSightRemovesByPriceInOneBatch(t *testing.T) {
	rig, clock := holdRig(t, 200_000)
	rig.sight = 0
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	var counts []int
	for turn := range 6 {
		if turn > 0 {
			g.human(fmt.Sprintf("Now step %d. %s", turn, strings.Repeat("Context the agent needs. ", 1000)))
		}
		g.send(reply{tools: 1})
		for range 4 {
			clock.advance(5 * time.Second)
			g.results(1, false, false)
			g.send(reply{tools: 1})
			counts = append(counts, bytes.Count(g.sent[len(g.sent)-1], []byte(`"type":"image"`)))
		}
		g.results(1, false, false)
		g.send(reply{})
		clock.advance(30 * time.Second)
	}
	drops := 0
	for i := 1; i < len(counts); i++ {
		if counts[i] < counts[i-1] {
			drops++
			if counts[i] == 0 {
				t.Fatalf("images per request %v: a batch took the current turn's screenshots", counts)
			}
		}
	}
	priced := rig.counter("removed", "priced")
	if drops == 0 || priced == 0 || drops > 3 || rig.counter("removed", "budget") != 0 {
		t.Fatalf("images per request %v: %d drops, %d removed by price; want a few batches by price, none for the budget", counts, drops, priced)
	}
}

// Past the provider's image limit, the oldest kept images leave in one
// batch down to half the limit, not one a request at the limit.
func TestProxyBatchesAtTheProviderImageLimit(t *testing.T) {
	rig, clock := holdRig(t, 200_000)
	rig.profile.Limits.MaxImages = 6
	rig.restart(t)
	g := newAgent(t, rig, "Fill in the form.")
	g.start()
	g.send(reply{tools: 1})
	var counts []int
	for range 10 {
		clock.advance(5 * time.Second)
		g.results(1, false, false)
		g.send(reply{tools: 1})
		counts = append(counts, bytes.Count(g.sent[len(g.sent)-1], []byte(`"type":"image"`)))
	}
	batches := 0
	for i, n := range counts {
		if n > 6 {
			t.Fatalf("request %d sent %d images; the limit is 6 (%v)", i, n, counts)
		}
		if i > 0 && n < counts[i-1] {
			batches++
		}
	}
	if batches == 0 || batches > 2 || rig.counter("removed", "provider_limit") < 3 {
		t.Fatalf("images per request %v, %d removed for the limit: want batches down to 3, not one a request", counts, rig.counter("removed", "provider_limit"))
	}
}

// Without write fees (OpenAI's automatic caching) a break costs next to
// nothing, and at the default sight nothing is held: the budget applies at
// each turn, as the seed says.
func TestProxyHoldNeedsACacheThatBillsWrites(t *testing.T) {
	rig, _ := holdRig(t, 20_000)
	rig.profile.Cache = tokens.CacheRules{MinTokens: 1024, Increment: 128, TTL: 5 * time.Minute, Automatic: true}
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	g.human("And now?")
	g.send(reply{})
	if n := bytes.Count(g.sent[len(g.sent)-1], []byte(`"type":"image"`)); n != 1 || rig.counter("removed", "budget") != 1 {
		t.Fatalf("%d screenshots sent at the next turn, %d removed; want the budget applied (1 kept, 1 removed)", n, rig.counter("removed", "budget"))
	}
}

// An OpenAI Chat tool cannot return an image in its tool message, so
// agents attach the screenshot in a user message right after it — alone,
// beside a text part (qwen-code's "Attached media from tool result:"), or
// split over several such messages: those images are the tool's (relayed,
// decided like any tool image) and the messages do not start a turn. A
// user message after the assistant's is the human's: its pasted image
// stays.
func TestProxyOpenAIScreenshotAfterAToolMessageIsTheTools(t *testing.T) {
	_, b64 := samplePNG(t)
	img := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}`
	call := `{"role":"user","content":"open the page"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"screenshot","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"taken"},`
	for _, c := range []struct {
		name, hist string
		tools      bool
	}{
		{"images only", call + `{"role":"user","content":[` + img + `]}`, true},
		{"beside a text part", call + `{"role":"user","content":[{"type":"text","text":"Attached media from tool result:"},` + img + `]}`, true},
		{"split over two messages", call + `{"role":"user","content":[{"type":"text","text":"Attached media from tool result:"}]},{"role":"user","content":[` + img + `]}`, true},
		{"the human's, after the assistant", `{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":[{"type":"text","text":"look"},` + img + `]}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGW(t, upstream.OpenAI, nil)
			off := []string{"X-Imgctx-Keep-Turn-Images", "off", "X-Imgctx-Session", "echo"}
			body := func(msgs string) []byte {
				return []byte(`{"model":"tiny-vision","messages":[` + msgs + `]}`)
			}
			if resp, b := g.do(t, "POST", "/v1/chat/completions", "", body(c.hist), off...); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			next := c.hist + `,{"role":"assistant","content":"done"},{"role":"user","content":"thanks"}`
			if resp, b := g.do(t, "POST", "/v1/chat/completions", "", body(next), off...); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			up := g.up.received()
			last := up[len(up)-1]
			tools := !bytes.Contains(last, []byte(`image_url`)) && bytes.Contains(last, []byte(`[image removed]`))
			if tools != c.tools {
				t.Fatalf("taken for the tool's: %v; want %v (keep off: a tool's image leaves at the next turn, a human's stays)", tools, c.tools)
			}
		})
	}
}

// Past the provider's request size (max_request_bytes), the oldest kept
// images leave in one batch down to the low-water mark of the limit, so
// that every request the provider gets fits, however large the agent's own
// body grows — and the agent's body is accepted past that size: imgctx
// cuts what it forwards. A batch stops at the mark: with keep.low_water
// at 0.6 the first leaves a kept image, the request after it under 60% of
// the limit (a later one may stop above the mark, when what is left is
// not yet measured).
func TestProxyKeepsEachRequestUnderTheProviderSize(t *testing.T) {
	for _, lowWater := range []float64{0, 0.6} {
		t.Run(fmt.Sprint("low water ", lowWater), func(t *testing.T) {
			rig, clock := holdRig(t, 200_000)
			g := newAgent(t, rig, "Fill in the form.")
			g.start()
			g.send(reply{tools: 1})
			g.results(1, false, false)
			g.send(reply{tools: 1})
			one := len(g.sent[1]) - len(g.sent[0]) // what a screenshot round adds
			limit := len(g.sent[1]) + 4*one
			rig.profile.Limits.MaxRequestBytes = int64(limit)
			rig.lowWater = lowWater
			rig.restart(t)
			for range 12 {
				clock.advance(5 * time.Second)
				g.results(1, false, false)
				g.send(reply{tools: 1})
			}
			batches, prev := 0, 0
			for i, b := range g.sent {
				if len(b) > limit {
					t.Fatalf("request %d is %d bytes; the provider takes %d", i, len(b), limit)
				}
				n := bytes.Count(b, []byte(`"type":"image"`))
				if n < prev {
					batches++
					// The first batch stops at the mark: under it, with a
					// kept image left beside the round's new one.
					if batches == 1 && lowWater > 0 && (n < 2 || float64(len(b)) > lowWater*float64(limit)) {
						t.Fatalf("request %d, after the first batch: %d bytes, %d images; want at most %.0f bytes and a kept image left", i, len(b), n, lowWater*float64(limit))
					}
				}
				prev = n
			}
			if last := g.body(); len(last) <= limit {
				t.Fatalf("the agent's body (%d bytes) never passed the provider's limit (%d): nothing was tested", len(last), limit)
			}
			if removed := rig.counter("removed", "provider_limit"); batches == 0 || batches > 4 || removed < 4 {
				t.Fatalf("%d batches, %d removed for the request size: want few batches, not one a request", batches, removed)
			}
		})
	}
}

// Each new image is counted stored once, however it is then decided: the
// gateway stores the bytes as it reads the request; the relay of a tool
// image on trial is a decision, not a second store.
func TestProxyCountsEachStoredImageOnce(t *testing.T) {
	rig, clock := holdRig(t, 200_000)
	g := newAgent(t, rig, "Fill in the form.")
	g.start()
	g.send(reply{tools: 1})
	for range 3 {
		clock.advance(5 * time.Second)
		g.results(2, false, false)
		g.send(reply{tools: 1})
	}
	stored := 0
	rig.images.List(t.Context(), "default", func(imagestore.Info) error { stored++; return nil })
	if n := rig.counter("stored", "*"); n != stored || stored != 6 {
		t.Fatalf("imgctx_images_total{event=\"stored\"} = %d for %d images in the store; want 6 and 6", n, stored)
	}
}

// A client that compacted its history starts a new conversation whose
// first request already carries its turn's screenshot: no earlier request
// of the conversation measures it, and it left as unmeasured at the next
// turn — the seed's rule for an engine not known to see images. Once an
// image of the tenant was measured on the same model, in any conversation,
// the engine is known to see, and it stays at its estimated cost.
func TestANewConversationKnowsTheEngineSees(t *testing.T) {
	compacted := func(rig *agentRig, clock *settableClock) []byte {
		g := newAgent(t, rig, "Summary of the earlier conversation: the login page is open. Go on.")
		g.start()
		g.msgs = append(g.msgs, `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_c1","name":"screenshot","input":{}}]}`)
		g.pending = []string{"toolu_c1"}
		g.results(1, false, false)
		g.send(reply{})
		clock.advance(30 * time.Second)
		g.human("And now?")
		g.send(reply{})
		return g.sent[len(g.sent)-1]
	}
	rig, clock := holdRig(t, 200_000)
	if last := compacted(rig, clock); !bytes.Contains(last, []byte("[image removed]")) || rig.counter("removed", "unmeasured") != 1 {
		t.Fatalf("nothing measured yet on this model: the screenshot stayed; want it removed as unmeasured")
	}
	rig, clock = holdRig(t, 200_000)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{}) // measures the screenshot
	if rig.counter("kept", "*") == 0 {
		t.Fatal("the first conversation measured no image")
	}
	if last := compacted(rig, clock); bytes.Contains(last, []byte("[image removed]")) || bytes.Count(last, []byte(`"type":"image"`)) != 1 {
		t.Fatalf("an image was measured on this model before: the new conversation's screenshot left as unmeasured")
	}
}

// Where images are not held (keep.hold off, or an automatic cache at
// keep.sight 1) a cold start may remove for the budget early, since the
// break is free then — but only where that saves a break: where, at the
// pace the conversation has brought screenshots, the kept ones would pass
// the budget before the cache next goes cold (policy.ColdBatchPays).
// Otherwise the batch would only trade sight for the reads it saves.
func TestProxyColdStartBatchesOnlyWhereTheBudgetWouldBreakBeforeTheNext(t *testing.T) {
	clock := &settableClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	rig := newAgentRig(t, 60_000, &session.Mem{}) // budget 6,000: four 1,334-token screenshots
	rig.clock = clock.now
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	sent := func() int { return bytes.Count(g.sent[len(g.sent)-1], []byte(`"type":"image"`)) }
	turn := func(shots int) {
		g.send(reply{tools: 1})
		for i := range shots {
			g.results(1, false, false)
			if i < shots-1 {
				g.send(reply{tools: 1})
			}
		}
		g.send(reply{})
	}
	g.start()
	turn(2) // three requests, two screenshots

	// Cold, two kept (2,668: past a quarter of the budget, where a fixed
	// share would batch): the next warm run, at this pace, brings two more,
	// 5,336 in all — under the budget.
	clock.advance(10 * time.Minute)
	g.human("Back after a break.")
	turn(2)
	if n := rig.counter("removed", "budget"); n != 0 {
		t.Fatalf("cold start with two screenshots kept, the budget a warm run away at this pace: %d removed; want them kept", n)
	}
	if n := bytes.Count(g.sent[len(g.sent)-3], []byte(`"type":"image"`)); n != 2 {
		t.Fatalf("the cold turn's first request sent %d screenshots; want the two kept", n)
	}

	// Cold again, four kept (5,336, under the budget): two more a run
	// would pass it with the cache warm, so they leave now, in one batch,
	// down to the low-water mark.
	clock.advance(10 * time.Minute)
	g.human("Back again.")
	g.send(reply{})
	if n := sent(); n != 0 || rig.counter("removed", "budget") != 4 {
		t.Fatalf("cold start with four kept, the budget within the next warm run: %d sent, %d removed; want all four removed in one batch", n, rig.counter("removed", "budget"))
	}
}
