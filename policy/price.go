package policy

import (
	"math"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
)

// DefaultSight is keep.sight's default: a kept image is worth what reading
// it from the cache costs, so no break is paid to stop reading it while
// the cache is warm, and none is kept past a cold start, where holding it
// would mean writing it again.
const DefaultSight = 1.0

// worthHalfLife is how many newer images halve a kept image's worth: the
// newest is worth Sight, the 21st newest half that. An agent needs the
// screens it just saw more than the ones before them; and were every image
// worth the same, the best schedule would be all or nothing — carry every
// image over a cold start or none — and the dial would jump between the
// two.
const worthHalfLife = 20

// worth is what showing the k-th newest kept image (k from 1) for one more
// request is worth, in multiples of reading it.
func worth(sight float64, k int) float64 {
	return sight * math.Exp2(-float64(k-1)/worthHalfLife)
}

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

// CompactionPays reports whether, at a window the prompt of est tokens has
// filled, the client's own compaction costs less than relieving the window
// by taking images out down to after tokens (limit: the window's usable
// share; grows: what one request adds). The relief keeps the text, so
// each request until the window fills again reads after tokens more than
// it would have, and its break rewrites them once; the compaction reads
// the window once, for its summary (at the read price while the cache is
// warm), and starts the next window from the summary, counted as nothing:
// its size is the client's, unknown here. Reading the text a whole window
// long outweighs one summary wherever the relief leaves more than one
// request's worth of tokens, so where the client compacts when refused
// this nearly always chooses the compaction; the images either leaves are
// alike — the relief takes them to its low-water mark, the compaction to
// none — and the window the compaction starts lower holds more of them.
func (c Costs) CompactionPays(est, after, limit, grows int, warm bool) bool {
	requests := float64(max(0, limit-after)) / float64(max(1, grows))
	relief := float64(after) * (requests*c.Read + c.Rewrite)
	summary := c.Read
	if !warm {
		summary = c.Rewrite
	}
	return relief >= float64(est)*summary
}

// Ledger is what pricing removals remembers across requests; the engine
// persists it with the keep state.
type Ledger struct {
	// Owed is what holding the removable images has cost since the last
	// batch, net of what seeing them is worth (USD). On an automatic cache
	// above a sight of 1 a batch leaves in it what it paid over or under
	// its break (Priced.carries), so it may be below zero.
	Owed float64 `json:"owed,omitempty"`
	// Run counts the requests since the cache last went cold; Runs and
	// RunTotal are the warm runs before it, for the expected length of
	// the next one.
	Run      int `json:"run,omitempty"`
	Runs     int `json:"runs,omitempty"`
	RunTotal int `json:"run_total,omitempty"`
	// Turns counts the human's turns, TurnAt is where the last one
	// started: requests per turn, for the wait until the next turn start.
	Turns  int `json:"turns,omitempty"`
	TurnAt int `json:"turn_at,omitempty"`
	// LongGaps counts the turns that came after the cache's default
	// lifetime had run out, within an hour: each read the conversation
	// again from a one-hour cache instead of writing it (KeepConfig.HourCache).
	LongGaps int `json:"long_gaps,omitempty"`
}

// HourPays says whether the one-hour cache lifetime pays for a
// conversation: one of its turns came after the default lifetime ran out
// and within the hour, where reading the conversation back from the cache
// (a tenth of the input price) replaces writing it again (1.25×); a
// one-hour write costs 2× instead of 1.25×, and only what the previous
// turn added is written so, so a conversation paced faster than the
// default lifetime never uses it.
func (l Ledger) HourPays() bool { return l.LongGaps > 0 }

// Count counts one request in the ledger's warm runs and turns (until is
// where the human's current turn starts). It returns where the turn before
// started when this request starts a turn, else -1.
func (l Ledger) Count(warm bool, until int) (Ledger, int) {
	if !warm {
		if l.Run > 0 {
			l.Runs++
			l.RunTotal += l.Run
		}
		l.Run = 0
	}
	l.Run++
	last := -1
	if until != l.TurnAt || l.Turns == 0 {
		last = l.TurnAt
		l.Turns++
		l.TurnAt = until
	}
	return l, last
}

// remaining is how many more requests the current warm run is expected to
// last: what the mean run has left, or — before any run ended — as many
// as it has lasted so far.
func (l Ledger) remaining() int {
	if l.Runs > 0 {
		return max(0, l.RunTotal/l.Runs-l.Run)
	}
	return l.Run
}

// turnLength is how many requests a turn has taken, on average.
func (l Ledger) turnLength() float64 {
	return float64(max(1, l.RunTotal+l.Run)) / float64(max(1, l.Turns))
}

// expectedRun is how many requests a warm cache is expected to last: the
// mean of the runs measured so far, or the current one before any ended.
func (l Ledger) expectedRun() int {
	if l.Runs > 0 {
		return max(1, l.RunTotal/l.Runs)
	}
	return max(1, l.Run)
}

// Priced is one request's removal decision by price.
type Priced struct {
	Sight float64 // keep.sight: what showing the newest kept image for one request is worth, in multiples of reading it
	Costs Costs
	Warm  bool // the provider still caches the conversation's prefix
	// Until is the message the human's current turn starts at: kept
	// images before it may leave; the current turn's stay, but on an
	// automatic cache its older ones (Priced.until).
	Until int
	// Limit is the provider's image limit (0: none): past it a batch is
	// forced, so images are carried over a cold start only as far as the
	// expected run leaves room for.
	Limit int
	// Suffix, when set, estimates the prompt's tokens from message i on,
	// kept images at their cost (a proxy knows text only by its span);
	// otherwise the messages' text is counted at four characters a token.
	Suffix func(i int) int
	// Postpones: the conversation's text is past half the point where its
	// history will be cut (PastHalfTheCut), so a removal would only
	// postpone the cut and price removes nothing; forced batches (the
	// window, the provider's limits) still run.
	Postpones bool
}

// held is the kept images price may remove (Priced.until).
type held struct {
	costs []int // oldest first
	ranks []int // each one's place among the request's images, 1 the newest
	first int   // the message of the oldest
}

// turnKeep is how many of a request's newest images price never removes
// where it may reach into the current turn: the screens the agent acts on
// (the provider's own computer-use loop keeps three).
const turnKeep = 3

// until is where the images price may remove end. On an explicit cache a
// break rewrites from a breakpoint before the edit, often the
// conversation's start, so the current turn's images stay and batches run
// at turns' starts. On an automatic prefix cache a break rewrites only
// from the first image removed, a break within a long turn costs no more
// than one at its start, and the turn's older images may leave too: all
// but the newest turnKeep.
func (p Priced) until(msgs []chat.Message) int {
	if p.Costs.Whole {
		return p.Until
	}
	n := 0
	for i := len(msgs) - 1; i > p.Until; i-- {
		if n += countImages(msgs[i : i+1]); n >= turnKeep {
			return i
		}
	}
	return p.Until
}

// keptBefore is the kept images of the messages before until.
func keptBefore(msgs []chat.Message, until int) held {
	h := held{first: -1}
	n := 0
	eachImage(msgs, func(i int, img chat.Image) {
		n++
		if i < until && img.Keep == chat.Kept {
			h.costs = append(h.costs, img.Cost)
			h.ranks = append(h.ranks, n)
			if h.first < 0 {
				h.first = i
			}
		}
	})
	for j := range h.ranks {
		h.ranks[j] = n + 1 - h.ranks[j]
	}
	return h
}

// warmWorth is what showing the image ranked k is worth while the cache is
// warm. On an automatic prefix cache a break rewrites only from the first
// image removed, so the images older than those worth their read pay
// toward a batch (Decide); on explicit breakpoints a
// break rewrites the whole conversation, and every kept image is worth the
// same, Sight, until a cold start or a forced batch.
func (p Priced) warmWorth(k int) float64 {
	if p.Costs.Whole || p.Sight <= 1 {
		return p.Sight
	}
	return worth(p.Sight, k)
}

// Decide weighs, at one request, holding the kept images of earlier turns
// against removing them, and returns the history, what left (reason
// priced) and the ledger to keep.
//
// While the cache is warm a removal breaks the cached prefix: everything
// it rewrites is written again (or billed at the input price) once, so a
// batch takes all of them. Holding costs each image its tokens at the read
// price on every request, less what seeing it is worth; below a sight of 1
// that is a loss, paid into the ledger, and the batch runs once the loss
// has paid for one break (the rent-or-buy rule, which for images arriving
// at a steady pace balances holding against breaking as the economic
// order quantity does). A turn's start, before its first image, is the
// cheapest place to break — the turn's images are not rewritten — so the
// batch runs there when the loss until the next turn's start would pay
// for it; on an automatic cache, where the break grows with what each turn
// adds after the oldest image, that growth counts too. From a sight of 1
// no break is paid to stop reading an image on an explicit cache; on an automatic one the images older than those
// worth their read (warmWorth) pay toward the batch by the same rule, and
// it takes every kept image but the turn's newest: the higher the dial,
// the fewer pay and the longer between batches; there a batch leaves in
// the ledger what holding paid over or under its break (carries).
//
// At a cold start the break is free and every kept image would be written
// again: the newest stay as long as seeing them for the expected warm run
// pays for that, as far as the provider's image limit leaves room at the
// pace images come; the rest leave.
func (p Priced) Decide(msgs []chat.Message, l Ledger) ([]chat.Message, []Removal, Ledger) {
	l, last := l.Count(p.Warm, p.Until)
	if p.Warm && p.Sight >= 1 && p.Costs.Whole && l.Owed == 0 {
		return msgs, nil, l // holding is worth its read: no break is ever paid while warm
	}
	if p.Postpones {
		l.Owed = 0
		return msgs, nil, l
	}
	until := p.until(msgs)
	h := keptBefore(msgs, until)
	leave, owed := 0, 0.0 // owed: what the ledger keeps after a batch
	if p.Warm {
		// The oldest images, worth less than their read, leave together.
		tokens, net := 0, 0.0
		for leave < len(h.costs) && p.warmWorth(h.ranks[leave]) < 1 {
			c := h.costs[leave]
			tokens += c
			net += float64(c) * p.Costs.Read * (1 - p.warmWorth(h.ranks[leave]))
			leave++
		}
		if leave == 0 {
			if !p.carries() {
				l.Owed = 0
			}
			return msgs, nil, l
		}
		l.Owed += net
		due, grown := l.Owed, 0.0
		if p.turnStart(msgs) {
			// A turn's start, before its first image: the cheapest break
			// until the next one, so the batch runs now when the holding
			// would have paid for it by then.
			due += net * l.turnLength()
			if !p.Costs.Whole && last >= 0 {
				// On an automatic cache the break rewrites from the oldest
				// image removed, so each turn it waits makes it dearer by
				// what the turn adds: a cost of holding too.
				grown = float64(p.growth(msgs, last)) * (p.Costs.Rewrite - p.Costs.Read)
				due += grown
			}
		}
		brk := p.breakCost(msgs, h.first, tokens)
		if due < brk {
			return msgs, nil, l
		}
		if !p.Costs.Whole {
			// The break is paid: on an automatic cache it rewrites from
			// the oldest image removed whatever else leaves, and each kept
			// image of earlier turns would leave in a later batch, at a
			// break of its own. The batch takes them all — the turn's
			// newest stay — and the next one comes that much later.
			leave = len(h.costs)
		}
		if p.carries() {
			owed = l.Owed + grown - brk
		}
	} else if leave = len(h.costs) - p.carried(msgs, h, l); leave == 0 {
		return msgs, nil, l
	}
	out, removed := evictOldest(msgs, until, leave, reason.Priced)
	l.Owed = owed
	return out, removed, l
}

// carries reports whether a batch leaves in the ledger what holding paid
// over its break, or under it at a turn's start: on an automatic cache
// above a sight of 1, where the images older than those worth their read
// pay toward a batch that takes every image of earlier turns. The next
// batch then comes that much sooner or later, so over many batches they
// keep to the pace price sets rather than to whole turns of it. Paid off
// at each batch, a conversation whose turns repeat put every batch at the
// same turn of its cycle, and the dial moved the images a request in
// steps of about one and a half on the simulator's gpt-4o workloads
// (BENCHMARKS.md, "The dial's steps, closed in part"). Below 1 every
// earlier image pays, and batches wait for a turn's start, the cheapest
// break: a remainder carried over moved them off it (gpt-4o computer-use
// at 0: 2.8 images a request for $7.95, against 3.0 for $7.90 paid off).
func (p Priced) carries() bool { return !p.Costs.Whole && p.Sight > 1 }

// growth is what the turn that started at message from added to the
// prompt, but its kept images (a batch takes them, they are not
// rewritten): what a break rewrites more for waiting a turn like it.
func (p Priced) growth(msgs []chat.Message, from int) int {
	if from >= min(p.Until, len(msgs)) {
		return 0
	}
	n := p.suffix(msgs, from) - p.suffix(msgs, p.Until)
	eachImage(msgs[from:p.Until], func(_ int, img chat.Image) {
		if img.Keep == chat.Kept {
			n -= img.Cost
		}
	})
	return max(n, 0)
}

// carried is how many of the newest held images stay over a cold start:
// each is written again now and read for the expected run, so it stays
// when its worth over that run pays for the write — and the run has room
// for it under the provider's image limit, at the pace images came.
func (p Priced) carried(msgs []chat.Message, h held, l Ledger) int {
	if p.Sight <= 1 {
		return 0
	}
	run := float64(l.expectedRun())
	room := len(h.costs)
	if p.Limit > 0 {
		room = min(room, p.Limit-(countImages(msgs)-len(h.costs))-int(math.Ceil(p.pace(msgs, l)*run)))
	}
	pays := 1 + (p.Costs.Rewrite-p.Costs.Read)/(run*p.Costs.Read)
	k := 0
	for k < room && worth(p.Sight, h.ranks[len(h.ranks)-1-k]) >= pays {
		k++
	}
	return k
}

// UnderLimit keeps the request under the provider's image limit: past it,
// the oldest kept images leave in one batch (reason provider_limit), down
// to LimitKeep.
func (p Priced) UnderLimit(msgs []chat.Message, l Ledger) ([]chat.Message, []Removal) {
	n := countImages(msgs)
	if p.Limit <= 0 || n <= p.Limit {
		return msgs, nil
	}
	return EvictOldest(msgs, n-p.LimitKeep(msgs, l), reason.ProviderLimit)
}

// turnStart reports whether the request is a turn's start, before the
// turn's first image.
func (p Priced) turnStart(msgs []chat.Message) bool {
	return countImages(msgs[min(p.Until, len(msgs)):]) == 0
}

// LimitKeep is how many images a request keeps when the provider's image
// limit forces a batch. The batch rewrites the prompt anyway; each image
// kept makes the next one come sooner. At a sight of 1 or less an image is
// worth no more than its read, so every kept image leaves (the images not
// kept — on trial, the user's — stay). Above it the newest are kept while what showing them is
// worth over reading them pays for the more frequent batches (a sawtooth
// between the kept images and the limit: a batch every (limit − kept) /
// pace requests), and as many as leave room for the rest of the expected
// warm run, when they are worth their read.
func (p Priced) LimitKeep(msgs []chat.Message, l Ledger) int {
	h := keptBefore(msgs, len(msgs)) // the batch takes kept images of the current turn too, oldest first
	fixed := countImages(msgs) - len(h.costs)
	if len(h.costs) == 0 || p.Sight <= 1 || p.Limit <= 0 {
		return fixed
	}
	tokens := 0
	for _, c := range h.costs {
		tokens += c
	}
	pace := p.pace(msgs, l)
	brk := p.breakCost(msgs, h.first, tokens)
	keep := fixed
	for k := 1; k <= len(h.costs) && fixed+k < p.Limit; k++ {
		c := float64(h.costs[len(h.costs)-k])
		gap := float64(p.Limit - fixed - k)
		if (worth(p.Sight, h.ranks[len(h.ranks)-k])-1)*p.Costs.Read*c*gap*gap < 2*brk*pace {
			break
		}
		keep = max(keep, fixed+k)
	}
	if room := p.Limit - int(math.Ceil(pace*float64(l.remaining()))); room > keep {
		for k := keep - fixed + 1; fixed+k <= room && k <= len(h.costs) && worth(p.Sight, h.ranks[len(h.ranks)-k]) >= 1; k++ {
			keep = fixed + k
		}
	}
	return min(keep, p.Limit)
}

// pace is the images a request has brought, on average, over its
// requests.
func (p Priced) pace(msgs []chat.Message, l Ledger) float64 {
	return float64(brought(msgs)) / float64(max(1, l.RunTotal+l.Run))
}

// brought is the images a history has brought: those it carries and those
// removed from it (their markers).
func brought(msgs []chat.Message) int {
	n := 0
	for _, m := range msgs {
		chat.Walk(m.Parts, func(part chat.Part, _ int) bool {
			switch x := part.(type) {
			case chat.Image:
				n++
			case chat.Marker:
				if x.Of == "image" {
					n++
				}
			}
			return true
		})
	}
	return n
}

// lookback is how many blocks an explicit-breakpoint cache reads back from
// a breakpoint for a prefix it holds (Anthropic: 20).
const lookback = 20

// breakCost is what removing the kept images from message first on costs
// while the cache is warm: the prompt from the edit on, without them,
// rewritten instead of read. On an automatic cache that is from the first
// removed image. With explicit breakpoints the cache reads back from the
// request's last block for at most lookback blocks, to a prefix an earlier
// request cached — at its own end, a user message —: an edit within reach
// rewrites from that prefix on; past it, from the conversation's start.
func (p Priced) breakCost(msgs []chat.Message, first, held int) float64 {
	if p.Costs.Whole {
		first = reachable(msgs, first)
	}
	return float64(max(p.suffix(msgs, first)-held, 0)) * (p.Costs.Rewrite - p.Costs.Read)
}

// suffix is the prompt's tokens from message first on, kept images at
// their cost (Priced.Suffix, else the text at four characters a token).
func (p Priced) suffix(msgs []chat.Message, first int) int {
	if p.Suffix != nil {
		return p.Suffix(first)
	}
	n := 0
	for _, m := range msgs[first:] {
		n += TextTokens(m.Parts, tokens.Chars4{}) + tokens.MessageFraming
		chat.Walk(m.Parts, func(part chat.Part, _ int) bool {
			if img, ok := part.(chat.Image); ok && img.Keep == chat.Kept {
				n += img.Cost
			}
			return true
		})
	}
	return n
}

// reachable is where an explicit-breakpoint cache reads up to once the
// messages from first on change: after the latest user message before
// first (an earlier request's end, cached there) that lies within lookback
// blocks of the request's end; else the start.
func reachable(msgs []chat.Message, first int) int {
	blocks := 0
	for j := len(msgs) - 1; j >= 0 && blocks <= lookback; j-- {
		if j < first && (msgs[j].Role == chat.User || msgs[j].Role == chat.Tool) {
			return j + 1
		}
		blocks += max(1, len(msgs[j].Parts))
	}
	return 0
}

// ColdBatchPays says whether, at a cold start, where removing the kept
// images breaks nothing, removing them down to the budget's low-water mark
// saves a break: whether, at the pace the conversation has brought images,
// they would pass the budget before the cache next goes cold (one mean
// warm run from now), and the budget would then remove them with the
// cache warm. Otherwise the batch only trades sight for reads it saves.
// l is the ledger before this request is counted (Ledger.Count).
func ColdBatchPays(msgs []chat.Message, l Ledger, budget int) bool {
	kept, n := 0, 0
	eachImage(msgs, func(_ int, img chat.Image) {
		if img.Keep == chat.Kept {
			kept += img.Cost
			n++
		}
	})
	if n == 0 {
		return false
	}
	runs, requests := l.Runs, l.RunTotal
	if l.Run > 0 { // the warm run this cold start ended
		runs++
		requests += l.Run
	}
	run := float64(requests) / float64(max(1, runs))
	pace := float64(brought(msgs)) / float64(max(1, requests))
	return float64(kept)+pace*run*float64(kept)/float64(n) > float64(budget)
}
