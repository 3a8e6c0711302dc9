package policy

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"pgregory.net/rapid"
)

// claude prices removals as Sonnet does: reads $0.30/M, writes $3.75/M,
// explicit breakpoints (a break rewrites from the start).
var claude = Costs{Read: 0.30 / 1e6, Rewrite: 3.75 / 1e6, Whole: true}

// gpt prices them as gpt-4o's automatic cache: a break only loses the read
// discount, from the edit on.
var gpt = Costs{Read: 1.25 / 1e6, Rewrite: 2.50 / 1e6}

// history is turns of screenshots (each kept at cost tokens) and text of
// textLen characters a message; the last turn is the current one and
// starts at the returned index.
func history(turns, shots, cost, textLen int) ([]chat.Message, int) {
	var msgs []chat.Message
	until := 0
	for t := range turns {
		until = len(msgs)
		msgs = append(msgs, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: strings.Repeat("u", textLen)}}})
		for s := range shots {
			msgs = withShot(msgs, fmt.Sprintf("t%d-s%d", t, s), cost, textLen)
		}
	}
	return msgs, until
}

// withShot appends a step of a turn: the assistant's text of textLen
// characters, then a tool result with a screenshot kept at cost tokens.
func withShot(msgs []chat.Message, name string, cost, textLen int) []chat.Message {
	img := shot(name, 200_000)
	img.Origin, img.Keep, img.Cost = chat.FromTool, chat.Kept, cost
	return append(msgs,
		chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: strings.Repeat("a", textLen)}}},
		chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Parts: []chat.Part{img}}}})
}

func kept(msgs []chat.Message, from, to int) int {
	n := 0
	for _, m := range msgs[from:to] {
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			if img, ok := p.(chat.Image); ok && img.Keep == chat.Kept {
				n++
			}
			return true
		})
	}
	return n
}

// While the cache is warm, holding is paid into the ledger request by
// request, and the images of earlier turns leave in one batch once it has
// paid one break — not one a request, never the current turn's.
func TestPricedRemovesInOneBatchOnceHoldingPaidABreak(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	p := Priced{Sight: 0, Costs: claude, Warm: true, Until: until}
	l := Ledger{Run: 1}
	breaks := p.breakCost(msgs, 0, 8*1334)
	perRequest := 8 * 1334 * claude.Read
	want := int(math.Ceil(breaks / perRequest))
	var out []chat.Message
	var removed []Removal
	for i := 1; ; i++ {
		out, removed, l = p.Decide(msgs, l)
		if len(removed) > 0 {
			if i != want {
				t.Fatalf("batch at request %d; holding pays one break (%.4f$ at %.5f$ a request) at request %d", i, breaks, perRequest, want)
			}
			break
		}
		if i > 1000 {
			t.Fatal("never removed")
		}
	}
	if len(removed) != 8 || kept(out, 0, until) != 0 || kept(out, until, len(out)) != 4 {
		t.Fatalf("removed %d; kept before the turn %d, in it %d: want the 8 of earlier turns in one batch, the turn's 4 kept",
			len(removed), kept(out, 0, until), kept(out, until, len(out)))
	}
	for _, r := range removed {
		if r.Reason != reason.Priced || r.Cost != 1334 {
			t.Fatalf("removal %+v: want reason priced at its cost", r)
		}
	}
	if l.Owed != 0 {
		t.Fatalf("ledger after the batch %v: want it paid off", l.Owed)
	}
	if kept(msgs, 0, len(msgs)) != 12 {
		t.Fatal("the history passed in was modified")
	}
}

// The dial: the more an image shown is worth (Sight), the later the batch;
// from 1 on (an image worth its read) no break is paid while warm.
func TestSightDelaysTheBatch(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	at := func(sight float64) int {
		p := Priced{Sight: sight, Costs: claude, Warm: true, Until: until}
		l := Ledger{}
		for i := 1; i <= 2000; i++ {
			var removed []Removal
			if _, removed, l = p.Decide(msgs, l); len(removed) > 0 {
				return i
			}
		}
		return -1
	}
	prev := 0
	for _, s := range []float64{0, 0.5, 0.9, 0.98} {
		n := at(s)
		if n <= prev {
			t.Fatalf("sight %v removes at request %d, not after sight below it (%d)", s, n, prev)
		}
		prev = n
	}
	for _, s := range []float64{1, 2} {
		if n := at(s); n != -1 {
			t.Fatalf("sight %v removed at request %d while warm; want never", s, n)
		}
	}
}

// A break on an explicit cache rewrites the conversation from its start; on
// an automatic one only from the edit: the same history pays off sooner
// there, and a long text before the images delays only the explicit one.
func TestBreakCostFollowsTheCache(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	long := append([]chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: strings.Repeat("x", 400_000)}}}}, msgs...)
	for _, c := range []struct {
		costs Costs
		grows bool
	}{{claude, true}, {gpt, false}} {
		p := Priced{Costs: c.costs, Until: until}
		short := p.breakCost(msgs, 0, 8*1334)
		p.Until = until + 1
		longer := p.breakCost(long, 1, 8*1334)
		if grows := longer > short*2; grows != c.grows {
			t.Fatalf("%+v: break %.4f$ without the long opening, %.4f$ with it; want it to grow %v", c.costs, short, longer, c.grows)
		}
	}
}

// At a cold start the break is free: images leave unless seeing them for
// the expected warm run pays for writing them again; that run is the mean
// of the runs measured, and no longer than the provider's image limit
// leaves at the pace images came.
func TestColdStartHoldsOnlyWhatPays(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	cold := func(sight float64, l Ledger, limit int) bool {
		p := Priced{Sight: sight, Costs: claude, Until: until, Limit: limit}
		_, removed, _ := p.Decide(msgs, l)
		return len(removed) == 8
	}
	long := Ledger{Run: 90}
	if !cold(0, long, 0) || !cold(1, long, 0) {
		t.Fatal("sight 0 and 1 must remove at a cold start")
	}
	// Writing again costs 11.5 reads: a run of 90 at sight 2 pays it, one of 10 not.
	if cold(2, long, 0) {
		t.Fatal("sight 2 with a 90-request run: want the images held")
	}
	if !cold(2, Ledger{Run: 5, Runs: 3, RunTotal: 25}, 0) {
		t.Fatal("sight 2 with runs of 10: want them removed")
	}
	// 12 images in 90 requests; a limit of 14 is reached in 15 requests.
	if !cold(1.5, long, 14) || cold(1.5, long, 100) {
		t.Fatal("the image limit near: want them removed; far: held")
	}
}

// Where the budget decides, a cold start's batch runs only when, at the
// conversation's pace, the kept images would pass the budget within one
// mean warm run: what the batch saves is that warm break.
func TestColdBatchPaysOnlyBeforeTheBudgetsWarmBreak(t *testing.T) {
	msgs, _ := history(2, 2, 1000, 10) // four kept, 4,000 tokens
	for _, c := range []struct {
		ledger Ledger
		budget int
		pays   bool
	}{
		// Four images in 8 requests, one run of 8: four more a run, 8,000.
		{Ledger{Run: 8}, 7_999, true},
		{Ledger{Run: 8}, 8_000, false},
		// Runs of 2 (8 requests, four runs): one more a run, 5,000.
		{Ledger{Run: 2, Runs: 3, RunTotal: 6}, 4_999, true},
		{Ledger{Run: 2, Runs: 3, RunTotal: 6}, 6_000, false},
	} {
		if got := ColdBatchPays(msgs, c.ledger, c.budget); got != c.pays {
			t.Errorf("%+v, budget %d: pays %v, want %v", c.ledger, c.budget, got, c.pays)
		}
	}
	if ColdBatchPays(msgs[:1], Ledger{Run: 8}, 1) {
		t.Error("nothing kept: a batch has nothing to save")
	}
}

// CostsOf reads the profile's prices: explicit breakpoints rewrite at the
// write price, from the start; automatic caches at the input price; no
// prices or no discount, no pricing.
func TestCostsOfProfiles(t *testing.T) {
	anth := tokens.Profile{Cache: tokens.CacheRules{Breakpoints: 4}, Prices: &tokens.Prices{Input: 3, CacheRead: 0.3, CacheWrite: 3.75}}
	oai := tokens.Profile{Cache: tokens.CacheRules{Automatic: true}, Prices: &tokens.Prices{Input: 2.5, CacheRead: 1.25}}
	if c, ok := CostsOf(anth); !ok || !c.Whole || math.Abs(c.Rewrite-3.75e-6) > 1e-12 {
		t.Fatalf("anthropic: %+v %v", c, ok)
	}
	if c, ok := CostsOf(oai); !ok || c.Whole || math.Abs(c.Rewrite-2.5e-6) > 1e-12 {
		t.Fatalf("openai: %+v %v", c, ok)
	}
	if _, ok := CostsOf(tokens.Profile{}); ok {
		t.Fatal("no prices: want no pricing")
	}
	if _, ok := CostsOf(tokens.Profile{Prices: &tokens.Prices{Input: 1}}); ok {
		t.Fatal("no cache discount: want no pricing")
	}
	// At sight 1 on an automatic cache every point costs the same per
	// image: the budget picks it, as before.
	cfg := KeepConfig{Hold: true, Sight: 1}
	if !cfg.Holds(anth) || cfg.Holds(oai) {
		t.Fatal("sight 1: want held on the explicit cache, the budget on the automatic one")
	}
	cfg.Sight = 0.9
	if !cfg.Holds(oai) {
		t.Fatal("sight 0.9: want priced on the automatic cache too")
	}
}

// Invariants over random conversations, going on request by request, and
// dial positions: the history passed in is never modified; a request
// removes the oldest kept images of earlier turns (every one of them at a
// sight of 1 or less, or while warm on an explicit cache), each counted
// with reason priced and its cost; the current turn's images stay (on an
// automatic cache its newest three); a ledger goes below zero only where a
// batch leaves its remainder in it (Priced.carries).
func TestPricedInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		msgs, until := history(rapid.IntRange(1, 5).Draw(t, "turns"), rapid.IntRange(0, 6).Draw(t, "shots"),
			rapid.IntRange(1, 3000).Draw(t, "cost"), rapid.IntRange(0, 2000).Draw(t, "text"))
		costs := rapid.SampledFrom([]Costs{claude, gpt}).Draw(t, "costs")
		l := Ledger{}
		before := kept(msgs, 0, len(msgs))
		for i := range rapid.IntRange(1, 40).Draw(t, "requests") {
			p := Priced{Sight: rapid.Float64Range(0, 3).Draw(t, "sight"), Costs: costs, Warm: rapid.Bool().Draw(t, fmt.Sprint("warm", i)), Until: until,
				Limit: rapid.SampledFrom([]int{0, 20, 100}).Draw(t, "limit")}
			reach := until // the current turn's images stay
			if !costs.Whole {
				reach = max(until, len(msgs)-2*turnKeep+1) // but its newest three (a screenshot every two messages)
			}
			out, removed, next := p.Decide(msgs, l)
			if kept(msgs, 0, len(msgs)) != before {
				t.Fatal("the history passed in was modified")
			}
			all := p.Sight <= 1 || (p.Warm && costs.Whole)
			if n := len(removed); n != 0 && all && n != kept(msgs, 0, reach) {
				t.Fatalf("removed %d of %d removable images: want none or all", n, kept(msgs, 0, reach))
			}
			if n := len(removed); n > 0 && kept(out, 0, reach) > 0 && lastMessage(removed) > firstKept(out) {
				t.Fatal("a newer image left before an older one")
			}
			if kept(out, reach, len(out)) != kept(msgs, reach, len(msgs)) {
				t.Fatal("an image of the current turn was removed")
			}
			for _, r := range removed {
				if r.Reason != reason.Priced || r.Cost <= 0 || r.Message >= reach {
					t.Fatalf("removal %+v", r)
				}
			}
			if next.Owed < 0 && l.Owed >= 0 && !p.carries() || next.Run < 1 {
				t.Fatalf("ledger %+v", next)
			}
			if len(removed) > 0 {
				msgs = out
			}
			l = next
			// The conversation goes on: a screenshot, a new turn, or
			// the same request again.
			switch rapid.IntRange(0, 2).Draw(t, fmt.Sprint("next", i)) {
			case 1:
				msgs = withShot(msgs, fmt.Sprint("next", i), rapid.IntRange(1, 3000).Draw(t, fmt.Sprint("cost", i)), 1)
			case 2:
				until = len(msgs)
				msgs = append(msgs, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "next"}}})
			}
			before = kept(msgs, 0, len(msgs))
		}
	})
}

// lastMessage is the message of the newest removal.
func lastMessage(rs []Removal) int {
	n := -1
	for _, r := range rs {
		n = max(n, r.Message)
	}
	return n
}

// firstKept is the message of the oldest kept image.
func firstKept(msgs []chat.Message) int {
	for i := range msgs {
		if kept(msgs, i, i+1) > 0 {
			return i
		}
	}
	return len(msgs)
}

// In a long turn on an automatic cache, where a break rewrites only from
// the first image removed, the turn's older screenshots leave by price too
// — in one batch with the earlier turns', all but the newest three —; on
// an explicit cache, where a break rewrites from a breakpoint before the
// turn, the current turn's images all stay.
func TestALongTurnLeavesItsNewestOnAnAutomaticCache(t *testing.T) {
	msgs, until := history(2, 15, 765, 400) // 15 screenshots of an earlier turn, 15 in the current one
	for _, c := range []struct {
		costs Costs
		stay  int // of the current turn's 15
	}{{gpt, turnKeep}, {claude, 15}} {
		p := Priced{Sight: 0, Costs: c.costs, Warm: true, Until: until}
		l := Ledger{Run: 1}
		var out []chat.Message
		var removed []Removal
		for range 500 {
			if out, removed, l = p.Decide(msgs, l); len(removed) > 0 {
				break
			}
		}
		if got := kept(out, until, len(out)); got != c.stay {
			t.Fatalf("%+v: %d of the current turn's screenshots stayed; want %d", c.costs, got, c.stay)
		}
		if got := kept(out, 0, until); got != 0 {
			t.Fatalf("%+v: %d of the earlier turn's stayed; want none", c.costs, got)
		}
		if want := 30 - c.stay; len(removed) != want {
			t.Fatalf("%+v: %d removed in the batch; want %d", c.costs, len(removed), want)
		}
		if got := kept(out, len(out)-2*turnKeep+1, len(out)); got != turnKeep {
			t.Fatalf("%+v: the newest %d screenshots did not all stay (%d)", c.costs, turnKeep, got)
		}
	}
}

// removedOldest checks that removals took the oldest kept images of msgs
// before until, in order, and returns how many stayed there.
func removedOldest(t *testing.T, msgs []chat.Message, until int, removed []Removal) int {
	t.Helper()
	var at []int
	for i := range msgs[:until] {
		for range kept(msgs, i, i+1) {
			at = append(at, i)
		}
	}
	for i, r := range removed {
		if r.Message != at[i] {
			t.Fatalf("removal %d in message %d: want the oldest first (%d)", i, r.Message, at[i])
		}
	}
	return len(at) - len(removed)
}

// At a cold start the newest images are carried over as far as seeing them
// for the expected run pays for writing them again — more of them the
// higher the dial — and only as far as the provider's image limit leaves
// room for the run at the pace images came; at a sight of 1 none.
func TestColdStartCarriesTheNewest(t *testing.T) {
	msgs, until := history(5, 8, 1334, 400) // 32 images of earlier turns, 8 in the current one
	carried := func(sight float64, limit int) int {
		p := Priced{Sight: sight, Costs: claude, Until: until, Limit: limit}
		_, removed, _ := p.Decide(msgs, Ledger{Run: 90})
		return removedOldest(t, msgs, until, removed)
	}
	if n := carried(1, 100); n != 0 {
		t.Fatalf("sight 1 carried %d: want none", n)
	}
	low, high := carried(1.5, 1000), carried(3, 1000)
	if low <= 0 || low >= high || high > 32 {
		t.Fatalf("sight 1.5 carried %d, sight 3 %d: want some, more with the dial", low, high)
	}
	// 40 images in 90 requests: a run of 90 brings 40 more; under a limit
	// of 60 the request has room for 60 − 8 − 40 = 12.
	if n := carried(3, 60); n != 12 {
		t.Fatalf("limit 60: carried %d, want the 12 the run has room for", n)
	}
	if n := carried(3, 40); n != 0 {
		t.Fatalf("limit 40: carried %d, want none (the run alone reaches it)", n)
	}
}

// A turn's start, before its first image, is the cheapest break: the batch
// runs there when the holding expected until the next turn's start would
// pay for it, where the same history one image into the turn waits for the
// ledger.
func TestATurnStartIsWhereTheBatchRuns(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	start := append(slices.Clone(msgs[:until]), chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "next"}}})
	mid := append(slices.Clone(start), msgs[until+1:until+3]...)
	l := Ledger{Run: 10, Turns: 1, TurnAt: 0}
	for _, c := range []struct {
		name string
		msgs []chat.Message
		now  bool
	}{{"turn start", start, true}, {"one image into the turn", mid, false}} {
		p := Priced{Sight: 0, Costs: claude, Warm: true, Until: until}
		_, removed, _ := p.Decide(c.msgs, l)
		if now := len(removed) > 0; now != c.now {
			t.Fatalf("%s: removed %d at once; want a batch now %v", c.name, len(removed), c.now)
		}
	}
}

// On an automatic cache a break rewrites from the oldest image removed, so
// waiting a turn makes it dearer by what the turn adds: at a turn's start
// that growth counts with the holding. Here the last turn added three
// times the text a break now rewrites, and the holding alone would not
// pay for the break until later: the batch runs now. An explicit cache's
// break is priced as before, and holds.
func TestAWaitedBreakGrowsOnAnAutomaticCache(t *testing.T) {
	msgs, until := history(2, 2, 765, 4000)
	start := append(slices.Clone(msgs[:until]), chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "next"}}})
	l := Ledger{Run: 5, Turns: 1}
	explicit := Costs{Read: gpt.Read, Rewrite: gpt.Rewrite, Whole: true}
	for _, c := range []struct {
		costs Costs
		now   bool
	}{{gpt, true}, {explicit, false}} {
		p := Priced{Sight: 0.95, Costs: c.costs, Warm: true, Until: until}
		if g := p.growth(start, 0); g < 2*(p.suffix(start, 2)-2*765) {
			t.Fatalf("growth %d tokens: want the last turn's text, about three times what a break rewrites", g)
		}
		_, removed, _ := p.Decide(start, l)
		if now := len(removed) > 0; now != c.now {
			t.Fatalf("whole %v: removed %d; want a batch now %v", c.costs.Whole, len(removed), c.now)
		}
	}
	// The turn's second request, still before its first image: the growth
	// was counted at its first.
	p := Priced{Sight: 0.95, Costs: gpt, Warm: true, Until: until}
	if _, removed, _ := p.Decide(start, Ledger{Run: 5, Turns: 2, TurnAt: until}); len(removed) > 0 {
		t.Fatalf("removed %d at a turn's second request with no holding paid", len(removed))
	}
}

// On an automatic cache the images worth less than their read (worth
// halves every 20 newer) pay toward one break, request after request; once
// it is paid the batch takes every kept image but the turn's newest three,
// oldest first, since each would otherwise leave at a later break of its
// own. The higher the dial, the later the batch. An explicit cache removes
// nothing while warm from a sight of 1.
func TestAutomaticCacheBatchKeepsTheTurnsNewest(t *testing.T) {
	msgs, until := history(6, 4, 765, 400) // 20 images of earlier turns, 4 in the current one
	batch := func(sight float64, costs Costs) (after, stay int) {
		p := Priced{Sight: sight, Costs: costs, Warm: true, Until: until}
		l := Ledger{Run: 1}
		for n := 1; n <= 500; n++ {
			out, removed, next := p.Decide(msgs, l)
			if l = next; len(removed) > 0 {
				for i := 1; i < len(removed); i++ {
					if removed[i].Message < removed[i-1].Message {
						t.Fatalf("sight %g: removal %d in message %d after one in %d: want the oldest first", sight, i, removed[i].Message, removed[i-1].Message)
					}
				}
				return n, kept(out, 0, len(out))
			}
		}
		return -1, -1
	}
	soon, stay := batch(1.2, gpt)
	if stay != turnKeep {
		t.Fatalf("sight 1.2: %d images stayed after the batch; want the turn's newest %d", stay, turnKeep)
	}
	late, stay := batch(1.5, gpt)
	if stay != turnKeep || late <= soon {
		t.Fatalf("sight 1.5: a batch after %d requests leaving %d; want later than 1.2's %d, leaving %d", late, stay, soon, turnKeep)
	}
	if after, _ := batch(1.5, claude); after != -1 {
		t.Fatalf("an explicit cache removed at request %d while warm at a sight of 1.5", after)
	}
}

// A batch forced by the image limit takes every kept image at a sight of 1
// or less, the current turn's too (only images not kept stay); above, it
// keeps more the higher the dial, never past the limit, and at least what
// leaves room for the rest of the run.
func TestLimitKeepFollowsTheDial(t *testing.T) {
	msgs, until := history(13, 8, 1334, 400) // 104 images: past a limit of 100
	keep := func(sight float64, l Ledger) int {
		return Priced{Sight: sight, Costs: claude, Warm: true, Until: until, Limit: 100}.LimitKeep(msgs, l)
	}
	long := Ledger{Run: 117}
	if n := keep(1, long); n != 0 {
		t.Fatalf("sight 1 keeps %d: want none", n)
	}
	a, b := keep(2, long), keep(8, long)
	if a <= 0 || a >= b || b >= 100 {
		t.Fatalf("sight 2 keeps %d, sight 8 %d: want more with the dial, under the limit", a, b)
	}
	// Runs of 120 requests, 117 gone: 3 more to go, and no batch after
	// this one whatever it keeps: every image still worth its read stays.
	if n := keep(8, Ledger{Run: 117, Runs: 2, RunTotal: 240}); n <= b {
		t.Fatalf("a run near its end keeps %d, no more than a long one (%d)", n, b)
	}
}

// An explicit cache reads back 20 blocks from the request's end to a prefix
// an earlier request cached: removing the images of the last few messages
// rewrites only from there, removing older ones the whole conversation.
func TestABreakWithinReachRewritesFromThere(t *testing.T) {
	msgs, until := history(4, 4, 1334, 4000) // turns of 9 messages, one block each
	p := Priced{Costs: claude, Until: len(msgs)}
	whole := p.breakCost(msgs, 0, 0)
	// The last turn's images: its human message (an earlier request's
	// end) lies 8 blocks from the end.
	recent := p.breakCost(msgs, until+2, 0)
	if recent >= whole/2 {
		t.Fatalf("removing the last turn's images rewrites %.4f$ of %.4f$: want from its start only", recent, whole)
	}
	// The turn before: its start lies 17 blocks back, still within reach;
	// two turns back (26 blocks) is not.
	if p.breakCost(msgs, until-7, 0) >= whole {
		t.Fatal("an edit 17 blocks back rewrote the whole conversation")
	}
	if got := p.breakCost(msgs, until-16, 0); got != whole {
		t.Fatalf("an edit 26 blocks back rewrites %.4f$: want the whole %.4f$", got, whole)
	}
}

// On an automatic cache the dial shows more images the higher it is on
// each side of 1 (exactly 1 is the budget's: KeepConfig.Holds). Not across
// it: below 1 every earlier image pays a small loss and batches are rare,
// above it only the images older than those worth their read pay. Each
// side is the cheaper at the images it shows (BENCHMARKS.md "The dial");
// one rule for both, monotone through 1, cost up to 3.4% more on Gemini.
func TestAutomaticCacheDialIsMonotoneOnEachSideOfOne(t *testing.T) {
	full, _ := history(1, 120, 765, 400)
	mean := func(sight float64) float64 {
		p := Priced{Sight: sight, Costs: gpt, Warm: true}
		var msgs []chat.Message
		l, total := Ledger{}, 0
		for r := 1; r <= 120; r++ {
			msgs = append(msgs, full[len(msgs):1+2*r]...)
			msgs, _, l = p.Decide(msgs, l)
			total += kept(msgs, 0, len(msgs))
		}
		return float64(total) / 120
	}
	for _, side := range [][]float64{{0, 0.5, 0.9, 0.95, 0.98}, {1.02, 1.05, 1.1, 1.2, 1.5, 2}} {
		last, lastSight := 0.0, 0.0
		for _, sight := range side {
			m := mean(sight)
			if m < last {
				t.Fatalf("sight %g shows %.2f images a request, fewer than sight %g's %.2f", sight, m, lastSight, last)
			}
			last, lastSight = m, sight
		}
	}
}

// Past half the cut price removes nothing, cold start or warm batch: a
// removal would only postpone the history's cut (Priced.Postpones); the
// bookkeeping of runs and turns goes on.
func TestPriceRemovesNothingThatWouldOnlyPostponeTheCut(t *testing.T) {
	msgs, until := history(3, 4, 1334, 400)
	for _, c := range []struct {
		name  string
		p     Priced
		l     Ledger
		below int // images removed before half the cut
	}{
		{"a cold start at sight 1 (Claude)", Priced{Sight: 1, Costs: claude, Until: until}, Ledger{Run: 90}, 8},
		{"a warm batch at sight 0 (gpt-4o)", Priced{Sight: 0, Costs: gpt, Warm: true, Until: until}, Ledger{Run: 5, Owed: 1}, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, removed, ref := c.p.Decide(msgs, c.l)
			if len(removed) < c.below {
				t.Fatalf("before half the cut: %d removed, want %d", len(removed), c.below)
			}
			c.p.Postpones = true
			out, removed, l := c.p.Decide(msgs, c.l)
			if len(removed) != 0 || kept(out, 0, len(out)) != kept(msgs, 0, len(msgs)) || l.Run != ref.Run || l.Runs != ref.Runs || l.Turns != ref.Turns || l.Owed != 0 {
				t.Fatalf("past half the cut: %d removed, ledger %+v (without it %+v)", len(removed), l, ref)
			}
		})
	}
	if !PastHalfTheCut(Base{Valid: true, Prompt: 9000}, 1000, 15000) || PastHalfTheCut(Base{Valid: true, Prompt: 8000}, 1000, 15000) ||
		PastHalfTheCut(Base{Prompt: 9000}, 1000, 15000) || PastHalfTheCut(Base{Valid: true, Prompt: 9000}, 1000, 0) {
		t.Fatal("PastHalfTheCut: the text (prompt less kept images) against half the cut, only with a measured prompt and a cut")
	}
}

// play runs a conversation of turns, each a human message and shots
// screenshots, deciding at every request; it returns the mean images a
// request shows and, after each batch, the ledger in breaks of that batch.
func play(p Priced, turns, shots int) (mean float64, left []float64) {
	var msgs []chat.Message
	l, total, requests := Ledger{}, 0, 0
	for t := range turns {
		p.Until = len(msgs)
		msgs = append(msgs, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: strings.Repeat("u", 400)}}})
		for s := 0; ; s++ {
			before := msgs
			var removed []Removal
			if msgs, removed, l = p.Decide(msgs, l); len(removed) > 0 {
				h := keptBefore(before, p.until(before))
				held := 0
				for _, c := range h.costs {
					held += c
				}
				left = append(left, l.Owed/p.breakCost(before, h.first, held))
			}
			total += kept(msgs, 0, len(msgs))
			requests++
			if s == shots {
				break
			}
			msgs = withShot(msgs, fmt.Sprintf("t%d-s%d", t, s), 765, 400)
		}
	}
	return float64(total) / float64(requests), left
}

// On an automatic cache above a sight of 1 a batch leaves in the ledger
// what holding paid over its break, or under it at a turn's start, so
// batches keep to the pace price sets, not to whole turns of it: on turns
// that repeat, paid off at each batch, the dial moved the images a request
// by whole multiples of the turn's newest three (6, 9, 12, … at turns of
// six). The remainder stays within a few breaks however long the
// conversation, and carries over requests where nothing pays. Below 1 and
// on an explicit cache the ledger is paid off at each batch.
func TestABatchLeavesItsRemainderOnAnAutomaticCache(t *testing.T) {
	prev, prevSight, positions, shown := 0.0, 0.0, 0, map[int]bool{}
	for sight := 1.1; sight < 2.9; sight += 0.05 {
		mean, left := play(Priced{Sight: sight, Costs: gpt, Warm: true}, 100, 6)
		if prev > 0 && mean-prev >= turnKeep {
			t.Fatalf("sight %.2f shows %.2f images a request, %.2f more than %.2f: want the dial finer than steps of turns", sight, mean, mean-prev, prevSight)
		}
		prev, prevSight = mean, sight
		positions++
		shown[int(math.Round(mean*10))] = true
		if !slices.ContainsFunc(left, func(r float64) bool { return r != 0 }) {
			t.Fatalf("sight %.2f: every batch paid the ledger off", sight)
		}
	}
	if len(shown) < positions*4/5 {
		t.Fatalf("%d positions of the dial show %d means (to a tenth of an image): want nearly each its own", positions, len(shown))
	}
	for _, sight := range []float64{1.3, 2.1} {
		_, left := play(Priced{Sight: sight, Costs: gpt, Warm: true}, 400, 6)
		for i, r := range left {
			if math.Abs(r) > 5 {
				t.Fatalf("sight %g, batch %d of %d: the ledger holds %.2f breaks; want the remainder bounded, not drifting", sight, i, len(left), r)
			}
		}
	}
	// Nothing pays (the batch left only the turn's newest): the remainder
	// stays.
	msgs, until := history(6, 4, 765, 400)
	p := Priced{Sight: 1.2, Costs: gpt, Warm: true, Until: until}
	l := Ledger{Run: 1}
	for range 500 {
		var removed []Removal
		if msgs, removed, l = p.Decide(msgs, l); len(removed) > 0 {
			break
		}
	}
	if l.Owed == 0 {
		t.Fatal("the batch left nothing in the ledger")
	}
	if _, removed, next := p.Decide(msgs, l); len(removed) > 0 || next.Owed != l.Owed {
		t.Fatalf("a request with nothing to pay removed %d, ledger %v → %v: want it carried", len(removed), l.Owed, next.Owed)
	}
	for _, c := range []struct {
		sight float64
		costs Costs
	}{{0.9, gpt}, {0.9, claude}} {
		_, left := play(Priced{Sight: c.sight, Costs: c.costs, Warm: true}, 60, 6)
		if len(left) == 0 || slices.ContainsFunc(left, func(r float64) bool { return r != 0 }) {
			t.Fatalf("sight %g, whole %v: %d batches, first ledgers after %v: want each paid off", c.sight, c.costs.Whole, len(left), left[:min(4, len(left))])
		}
	}
}

// The relief pays only where it leaves less than about one request's worth
// of tokens to read until the window fills again, or where the cache is
// cold and the summary would read the window at the full price.
func TestCompactionPays(t *testing.T) {
	for _, c := range []struct {
		after, grows int
		warm, pays   bool
	}{
		{after: 500, grows: 1000, warm: true, pays: false},     // 500 × (199.5 reads + a write) < the window read once
		{after: 20_000, grows: 1000, warm: true, pays: true},   // the text read 180 times
		{after: 20_000, grows: 50_000, warm: true, pays: true}, // 3.6 requests: still more than the summary
		{after: 5_000, grows: 1000, warm: true, pays: true},
		{after: 5_000, grows: 1000, warm: false, pays: false}, // cold: the summary writes the window
		{after: 200_000, grows: 1000, warm: true, pays: true}, // nothing left to relieve: the break alone
	} {
		if got := claude.CompactionPays(200_000, c.after, 200_000, c.grows, c.warm); got != c.pays {
			t.Errorf("%+v: pays %v", c, got)
		}
	}
}
