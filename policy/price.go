package policy

import (
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
)

// DefaultSight is keep.sight's default: a kept image is worth what reading
// it from the cache costs, so no break is paid to stop reading it while
// the cache is warm, and none is kept past a cold start, where holding it
// would mean writing it again.
const DefaultSight = 1.0

// Costs are the prices a removal decision weighs, in US dollars per token.
type Costs struct {
	Read    float64 // a token read from the provider's cache
	Rewrite float64 // a token of a broken prefix: written again (explicit caches) or billed at the input price (automatic ones)
	// Whole: a break rewrites the conversation from its start. With
	// explicit breakpoints the provider reads back only from one (20
	// blocks at most) and the client's sit at the end of each request:
	// past an edit nothing is readable but what precedes the messages.
	// Automatic prefix caches read up to the edit.
	Whole bool
}

// CostsOf returns a profile's removal prices; ok is false when it has none
// (no prices, or no cache discount), and images are kept by the budget.
func CostsOf(p tokens.Profile) (Costs, bool) {
	pr := p.Prices
	if pr == nil || pr.CacheRead <= 0 {
		return Costs{}, false
	}
	c := Costs{Read: pr.CacheRead / 1e6, Rewrite: pr.Input / 1e6}
	if p.Cache.Breakpoints > 0 {
		c.Whole = true
		if pr.CacheWrite > 0 {
			c.Rewrite = pr.CacheWrite / 1e6
		}
	}
	return c, c.Rewrite > c.Read
}

// Ledger is what pricing removals remembers across requests; the engine
// persists it with the keep state.
type Ledger struct {
	// Owed is what holding the removable images has cost since the last
	// batch, net of what seeing them is worth (USD).
	Owed float64 `json:"owed,omitempty"`
	// Run counts the requests since the cache last went cold; Runs and
	// RunTotal are the warm runs before it, for the expected length of
	// the next one.
	Run      int `json:"run,omitempty"`
	Runs     int `json:"runs,omitempty"`
	RunTotal int `json:"run_total,omitempty"`
}

// expectedRun is how many requests a warm cache is expected to last: the
// mean of the runs measured so far, or the current one before any ended.
func (l Ledger) expectedRun() int {
	if l.Runs > 0 {
		return max(1, l.RunTotal/l.Runs)
	}
	return max(1, l.Run)
}

// readFor is how many requests images held past a cold start are expected
// to be read: the expected warm run, or fewer when the provider's image
// limit will force a batch before it ends, at the pace images have come.
func (p Priced) readFor(msgs []chat.Message, l Ledger) int {
	run := l.expectedRun()
	if p.Limit <= 0 {
		return run
	}
	n := countImages(msgs)
	requests := l.RunTotal + max(l.Run, 1)
	if n == 0 {
		return run
	}
	return max(1, min(run, (p.Limit-n)*requests/n))
}

// Priced is one request's removal decision by price.
type Priced struct {
	Sight float64 // keep.sight: what showing a kept image for one request is worth, in multiples of reading it
	Costs Costs
	Warm  bool // the provider still caches the conversation's prefix
	// Until is the message the human's current turn starts at: kept
	// images before it may leave, the current turn's stay.
	Until int
	// Limit is the provider's image limit (0: none): past it a batch is
	// forced, so an image held past a cold start is read until then at
	// most.
	Limit int
	// Suffix, when set, estimates the prompt's tokens from message i on,
	// kept images at their cost (a proxy knows text only by its span);
	// otherwise the messages' text is counted at four characters a token.
	Suffix func(i int) int
}

// Decide weighs, at one request, holding the kept images of earlier turns
// against removing them all in one batch, and returns the history, what
// left (reason priced) and the ledger to keep.
//
// Removing breaks the cached prefix at the oldest of them: everything after
// it is written again (or billed at the input price) once; removing all of
// them at once is the cheapest break, since what stays is all that is
// rewritten. Holding costs each image its tokens at the read price on every
// request, less what seeing it is worth (Sight times that). While the cache
// is warm, holding is paid into the ledger and the batch runs when the
// ledger reaches the break's cost — the rent-or-buy rule, which never pays
// more than twice the better of the two in hindsight and, for images that
// arrive at a steady pace, removes at the period that balances the two. At
// a cold start the break is free: the images leave unless seeing them for
// the expected warm run pays for writing them again.
func (p Priced) Decide(msgs []chat.Message, l Ledger) ([]chat.Message, []Removal, Ledger) {
	if !p.Warm {
		if l.Run > 0 {
			l.Runs++
			l.RunTotal += l.Run
		}
		l.Run = 0
	}
	l.Run++
	if p.Warm && p.Sight >= 1 && l.Owed == 0 {
		return msgs, nil, l // holding is worth its read: no break is ever paid while warm
	}
	held, first := 0, -1
	for i := 0; i < p.Until && i < len(msgs); i++ {
		chat.Walk(msgs[i].Parts, func(part chat.Part, _ int) bool {
			if img, ok := part.(chat.Image); ok && img.Keep == chat.Kept {
				held += img.Cost
				if first < 0 {
					first = i
				}
			}
			return true
		})
	}
	if held == 0 {
		l.Owed = 0
		return msgs, nil, l
	}
	net := float64(held) * p.Costs.Read * (1 - p.Sight) // a request's holding, less its worth
	remove := false
	if p.Warm {
		l.Owed = max(0, l.Owed+net)
		remove = net > 0 && l.Owed >= p.breakCost(msgs, first, held)
	} else {
		// Kept, they are written again now and read for the expected run.
		hold := float64(held)*(p.Costs.Rewrite-p.Costs.Read) + float64(p.readFor(msgs, l))*net
		remove = hold > 0
	}
	if !remove {
		return msgs, nil, l
	}
	out, removed := removeKept(msgs, p.Until, reason.Priced)
	l.Owed = 0
	return out, removed, l
}

// breakCost is what removing the kept images before Until costs while the
// cache is warm: the prompt from the oldest of them on (or from the start:
// Costs.Whole), without them, rewritten instead of read.
func (p Priced) breakCost(msgs []chat.Message, first, held int) float64 {
	if p.Costs.Whole {
		first = 0
	}
	suffix := 0
	if p.Suffix != nil {
		suffix = p.Suffix(first)
	} else {
		for _, m := range msgs[first:] {
			suffix += TextTokens(m.Parts, tokens.Chars4{}) + tokens.MessageFraming
			chat.Walk(m.Parts, func(part chat.Part, _ int) bool {
				if img, ok := part.(chat.Image); ok && img.Keep == chat.Kept {
					suffix += img.Cost
				}
				return true
			})
		}
	}
	return float64(max(suffix-held, 0)) * (p.Costs.Rewrite - p.Costs.Read)
}

// removeKept replaces every kept image of the messages before until by a
// marker with why, in one batch.
func removeKept(msgs []chat.Message, until int, why reason.Code) ([]chat.Message, []Removal) {
	var removed []Removal
	out := edit(msgs, func(i int, part chat.Part, _ int) ([]chat.Part, bool) {
		img, ok := part.(chat.Image)
		if !ok || img.Keep != chat.Kept || i >= until {
			return nil, false
		}
		removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: why, Message: i, Cost: img.Cost})
		return markerFor(img, why), true
	})
	return out, removed
}
