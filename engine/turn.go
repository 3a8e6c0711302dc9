package engine

import (
	"context"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire"
)

// proxyRequest is one request of a drop-in client: the whole history, as
// Proxy read it. decide says what of its images goes upstream; Proxy
// writes the bytes.
type proxyRequest struct {
	Tenant string
	// Key names the conversation (ConversationKey): a hash of its identity
	// and of its first messages, never a client's raw value.
	Key     string
	Model   string
	Profile tokens.Profile
	// Messages is the view: images and documents filled in (by ref, an
	// image inside a tool result with Origin FromTool), everything else
	// opaque.
	Messages []chat.Message
	// Prior is the conversation's previous request with its decisions put
	// back (proxyTurn.applied), when this request's view extends that
	// request's in place: its messages are Messages[:len(Prior)], and the
	// room behind them is this request's to append to.
	Prior []chat.Message
	// Text counts what messages[from:] bill as text, framing included (the
	// view carries no text). It is called only to measure a request.
	Text func(from int) int
	// Estimate is a cheap estimate of the text tokens of messages[from:],
	// for window pressure.
	Estimate func(from int) int
	// Compacted is the index of the last message holding a provider
	// compaction block, 0 when none (wire.Spliced.Compacted): images
	// before it are not sent.
	Compacted int
	// Keep is the keep-turn-images switch for this conversation.
	Keep bool
	// Bytes is the request body's size as the client sent it (0:
	// unknown): the provider's max_request_bytes is kept with it.
	Bytes int64
	// Files: the request's images may go by file id (FilesFrom).
	Files bool
}

// proxyTurn is a proxied request between decide and Close: what to send,
// and what was not sent. Observe the answer, Overflow on prompt-too-long,
// and Close in every case (it persists the decisions and releases the
// conversation).
type proxyTurn struct {
	// Messages is what goes upstream: the view with each image not sent
	// replaced by its marker.
	Messages []chat.Message
	// NotSent is every image of the request not sent, with its reason —
	// removed by this request or an earlier one — once each.
	NotSent []policy.Removal
	// Events are the decisions this request made (first removals, relays,
	// measurements, retries).
	Events []Event

	e      *Engine
	r      proxyRequest
	en     *proxiedEntry
	st     session.Proxied
	kt     *policy.KeepTurn
	ledger policy.Ledger // pricing removals, persisted with the keep state
	turnAt int
	idle   bool // the conversation was idle past the cache's lifetime
	// compacts: the window's refusal is left to the client, whose
	// compaction costs less than relieving it (compactionPays); left: the
	// provider refused it, so the client has the refusal to compact on.
	compacts, left bool
	// Break is why the provider read less of its cache than the previous
	// request left there ("image", "expired", "other"); "" when it did not.
	Break     string
	filesFrom int // FilesFrom before this request's removals
	// applied is the view with the decisions put back and room behind it,
	// for the conversation's next request (proxyRequest.Prior); nil where
	// they changed nothing.
	applied   []chat.Message
	closed    bool
	settled   bool // the decisions are the conversation's (Settle)
	unwritten bool // and still to be written to the store (Close)
}

func (e *Engine) proxyMaxImages() int {
	if e.ProxyMaxImages > 0 {
		return e.ProxyMaxImages
	}
	return 10_000
}

func (e *Engine) lowWater() float64 {
	if e.KeepLowWater > 0 && e.KeepLowWater < 1 {
		return e.KeepLowWater
	}
	return 0.1
}

func (e *Engine) cacheTTL() time.Duration {
	if e.CacheTTL > 0 {
		return e.CacheTTL
	}
	return 5 * time.Minute
}

// decide decides a proxied request with the same turn model as Call:
// the turn starts at the human's last message; tool images in it are
// relayed (trial, measured from the usage of the answer that first showed
// them, kept within the budget or ephemeral); images of earlier turns go
// as decided then (kept, or a marker with the reason, never rewritten);
// window pressure removes kept images first, then the user's images of
// earlier turns, oldest first, in one batch down to the low-water mark.
//
// The decisions of one conversation are serialised, not its upstream
// calls: requests of one conversation come one at a time from an agent;
// concurrent ones (a load test re-sending one body) are decided from the
// same state, and the last to finish records its decisions.
func (e *Engine) decide(ctx context.Context, r proxyRequest) (*proxyTurn, error) {
	e.once.Do(e.init)
	f := &proxyTurn{e: e, r: r, en: e.proxied.entry(r.Tenant, r.Key)}
	f.en.mu.Lock()
	defer f.en.mu.Unlock()
	if err := f.en.load(ctx, e.Sessions); err != nil {
		return nil, err
	}
	st := f.en.st
	now := e.now()
	cold := st.LastActivity.IsZero() || now.Sub(st.LastActivity) > e.cacheTTL() || (st.Model != "" && st.Model != r.Model)
	f.st, f.ledger = st, st.Keep.Ledger
	f.idle = !st.LastActivity.IsZero() && now.Sub(st.LastActivity) > e.cacheTTL()
	f.turnAt = humanTurn(r.Messages)
	live := f.applyDecisions()
	switch {
	case cold:
		f.filesFrom = 0 // nothing cached: every image may go by file id
	case st.FilesFrom == nil:
		f.filesFrom = st.Messages // file ids only for what the cache does not hold yet
	default:
		f.filesFrom = *st.FilesFrom
	}

	if _, seen := e.seeing.Load(r.Tenant + "\x00" + r.Profile.Name); seen && !st.Keep.EngineBlind {
		st.Keep.Vouched = true
	}
	setting := policy.Turn{Config: e.Keep, Profile: r.Profile, Thread: chat.Main, Switch: r.Keep, State: st.Keep,
		Counter: tokens.CounterFor(r.Profile.Tokenizer), Storer: storer{e.Images, r.Tenant}, Cut: e.proxyThreshold(r.Profile.ContextWindow)}
	if f.turnAt == st.TurnAt && st.Turn != nil {
		f.kt = policy.ResumeTurn(setting, *st.Turn)
	} else {
		if st.Turn != nil {
			// The human spoke again: the last turn is over.
			var removed []policy.Removal
			live, removed, setting.State = policy.ResumeTurn(setting, *st.Turn).Finish(live)
			f.removed(removed)
		}
		live = f.adopt(live)
		live = f.evictForBudget(live, cold, &setting)
		f.kt = policy.StartTurn(setting)
		var removed []policy.Removal
		live, removed = f.kt.Start(live)
		f.removed(removed)
	}
	live = f.relayTurn(live)
	live = f.kt.Rewritten(live)
	live = f.priced(live, cold)
	live = f.relieve(live)
	live = f.imageLimit(live, cold)
	live = f.byteLimit(live)
	f.send(live)
	return f, nil
}

// eachImage calls fn with every image of msgs and its place (the nested
// index -1 when it is not in a tool result). Messages that hold no image
// are not read (chat.Imaged): most of a long agent history is text.
func eachImage(msgs []chat.Message, fn func(wire.Pos, chat.Image)) {
	for _, i := range chat.Imaged(msgs) {
		partsOf(i, msgs[i], func(at wire.Pos, p chat.Part) {
			if img, ok := p.(chat.Image); ok {
				fn(at, img)
			}
		})
	}
}

// eachPart calls fn with every part of msgs but the tool results
// themselves, whose parts it visits instead, and its place.
func eachPart(msgs []chat.Message, fn func(wire.Pos, chat.Part)) {
	for i, m := range msgs {
		partsOf(i, m, fn)
	}
}

// partsOf is eachPart for msgs[i], which is m.
func partsOf(i int, m chat.Message, fn func(wire.Pos, chat.Part)) {
	for j, p := range m.Parts {
		if tr, ok := p.(chat.ToolResult); ok {
			for k, q := range tr.Parts {
				fn(wire.Pos{Msg: i, Part: j, Nested: k}, q)
			}
			continue
		}
		fn(wire.Pos{Msg: i, Part: j, Nested: -1}, p)
	}
}

// editImages returns msgs with fn's replacement for each image it changes;
// msgs is never modified (messages and part slices are copied on write).
func editImages(msgs []chat.Message, fn func(wire.Pos, chat.Image) (chat.Part, bool)) []chat.Message {
	ed := editor{in: msgs}
	eachImage(msgs, func(at wire.Pos, img chat.Image) {
		if q, ok := fn(at, img); ok {
			ed.put(at, q)
		}
	})
	return ed.result()
}

// editParts is editImages for any part eachPart visits.
func editParts(msgs []chat.Message, fn func(wire.Pos, chat.Part) (chat.Part, bool)) []chat.Message {
	ed := editor{in: msgs}
	eachPart(msgs, func(at wire.Pos, p chat.Part) {
		if q, ok := fn(at, p); ok {
			ed.put(at, q)
		}
	})
	return ed.result()
}

// editor puts parts into a copy of messages, copying the slice once and
// each message it changes once.
type editor struct {
	in, out []chat.Message
	copied  map[int]bool
	room    bool // the copy has room for a few more rounds behind it
}

func (ed *editor) put(at wire.Pos, q chat.Part) {
	if !ed.copied[at.Msg] {
		if ed.copied == nil {
			ed.copied = map[int]bool{}
			if ed.room {
				ed.out = withRoom(ed.in)
			} else {
				ed.out = append([]chat.Message(nil), ed.in...)
			}
		}
		ed.copied[at.Msg] = true
		ed.out[at.Msg] = ed.out[at.Msg].Clone()
	}
	wire.Put(ed.out, at, q)
}

// withRoom is a copy of msgs with room behind it for a few more rounds,
// as append would leave: the conversation's next request extends it.
func withRoom(msgs []chat.Message) []chat.Message {
	return append(make([]chat.Message, 0, len(msgs)+len(msgs)/4+16), msgs...)
}

func (ed *editor) result() []chat.Message {
	if ed.out == nil {
		return ed.in
	}
	return ed.out
}

// humanTurn is the index of the last message carrying the human's input: a
// user message that is not only tool results (text riding next to tool
// results — reminders — belongs to the turn in progress). -1 when none.
func humanTurn(msgs []chat.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role != chat.User || len(m.Parts) == 0 || chat.RelaysTool(msgs, i) {
			continue
		}
		human := true
		for _, p := range m.Parts {
			if _, ok := p.(chat.ToolResult); ok {
				human = false
			}
		}
		if human {
			return i
		}
	}
	return -1
}

// applyDecisions puts what was decided before back at its place: kept
// images with their measured cost, markers for removed ones (counted as
// not sent), the open turn's relays with their occurrence. A decision whose
// place now holds another image (the client rewrote its history) is
// dropped. Images before a provider compaction block are not sent.
//
// Where the previous request's messages come out as they did there
// (r.Prior: each of their images stands as it stood), this request takes
// them over and appends its own, and the history is not copied. That
// fails where the previous request brought an image: its decision was
// made after that request put the earlier ones back.
func (f *proxyTurn) applyDecisions() []chat.Message {
	decided := make(map[wire.Pos]session.Decided, len(f.st.Images))
	for _, d := range f.st.Images {
		decided[wire.Pos{Msg: d.Msg, Part: d.Part, Nested: d.Nested}] = d
	}
	type change struct {
		at wire.Pos
		q  chat.Part
	}
	var changes []change
	prior := f.r.Prior
	eachImage(f.r.Messages, func(at wire.Pos, img chat.Image) {
		q, ok := f.decisionAt(decided, at, img)
		if at.Msg < len(prior) {
			if was := wire.At(prior, at); ok && was != q || !ok && was != chat.Part(img) {
				prior = nil
			}
		}
		if ok {
			changes = append(changes, change{at, q})
		}
	})
	ed := editor{in: f.r.Messages, room: true}
	if len(prior) > 0 {
		out := append(prior, f.r.Messages[len(prior):]...)
		ed = editor{in: out, out: out, copied: map[int]bool{}}
	}
	for _, c := range changes {
		if c.at.Msg >= len(prior) {
			ed.put(c.at, c.q)
		}
	}
	if ed.out == nil {
		return f.r.Messages
	}
	f.applied = ed.out
	return ed.out[:len(ed.out):len(ed.out)]
}

// decisionAt is what the conversation's decisions put at an image of the
// request, and whether that differs from the image as it came. It counts
// the image as not sent where that is a marker, so it is asked once an
// image.
func (f *proxyTurn) decisionAt(decided map[wire.Pos]session.Decided, at wire.Pos, img chat.Image) (chat.Part, bool) {
	d, ok := decided[at]
	if ok && d.Ref != img.Ref {
		ok = false
	}
	if at.Msg < f.r.Compacted && (!ok || d.Keep != chat.Removed) {
		f.removed([]policy.Removal{{Ref: img.Ref, Of: "image", Reason: reason.Compaction, Message: at.Msg}})
		mk, _ := chat.MarkerFor(img, string(reason.Compaction))
		return mk, true
	}
	if !ok {
		return nil, false
	}
	switch d.Keep {
	case chat.Removed:
		f.NotSent = append(f.NotSent, policy.Removal{Ref: img.Ref, Of: "image", Reason: d.Reason, Message: at.Msg})
		mk, _ := chat.MarkerFor(img, string(d.Reason))
		return mk, true
	case chat.Kept:
		img.Keep, img.Cost, img.Occ = chat.Kept, d.Cost, d.Occ
	default:
		img.Keep, img.Occ = d.Keep, d.Occ
	}
	return img, true
}

// adopt takes the tool images of earlier turns that have no decision (a
// conversation imgctx joins mid-way, or whose decisions expired) as kept
// at their estimated cost: they stay, within the budget like any other.
func (f *proxyTurn) adopt(live []chat.Message) []chat.Message {
	return editImages(live, func(at wire.Pos, img chat.Image) (chat.Part, bool) {
		if at.Msg >= f.turnAt || img.Origin != chat.FromTool || img.Keep != "" {
			return nil, false
		}
		img.Keep, img.Cost = chat.Kept, f.imageCost(img)
		return img, true
	})
}

func (f *proxyTurn) imageCost(img chat.Image) int {
	if img.Cost > 0 {
		return img.Cost
	}
	if n, err := tokens.ImageTokens(f.r.Profile, img.Width, img.Height, img.Detail); err == nil {
		return n
	}
	return tokens.DefaultImageTokenEstimate
}

func (f *proxyTurn) budget() int { return f.e.Keep.Budget(f.r.Profile.ContextWindow) }

// evictForBudget runs at a turn's start where images are not held (a
// profile without prices, or an automatic cache at keep.sight 1): kept
// images over the budget leave, oldest first, down to the low-water mark
// in one batch, so that several more fit before the next batch. With the
// provider's cache cold anyway (idle past its TTL, another model) a batch
// breaks nothing, so it runs early, past the low-water mark, where that
// saves a break: where, at the conversation's pace, the kept images would
// pass the budget before the cache next goes cold (policy.ColdBatchPays).
// Elsewhere it would only trade sight for the reads it saves: from the
// low-water mark always, it lost coding × gpt-4o to the agents' own
// loops, which kept their few screenshots for under 1% more (BENCHMARKS.md
// "The cold start's batch runs only where it saves a break").
func (f *proxyTurn) evictForBudget(live []chat.Message, cold bool, t *policy.Turn) []chat.Message {
	if f.e.Keep.Holds(f.r.Profile) {
		return live // price decides, at each request (priced)
	}
	if t.Postpones(policy.KeptCost(live)) {
		return live // a removal would only postpone the client's compaction
	}
	budget := f.budget()
	low := int(f.e.lowWater() * float64(budget))
	threshold := budget
	if cold && policy.ColdBatchPays(live, f.ledger, budget) {
		threshold = low
	}
	out, removed, _ := policy.EvictImages(live, policy.Pressure{Estimate: policy.KeptCost(live), Threshold: threshold, LowWater: max(low, 1)}, reason.Budget)
	if len(removed) > 0 {
		f.removed(removed)
		t.State.Base.Valid = false
	}
	return out
}

// priced lets price decide, at each request, whether the kept images of
// earlier turns leave, all in one batch (policy.Priced at keep.sight).
func (f *proxyTurn) priced(live []chat.Message, cold bool) []chat.Message {
	postpones := policy.PastHalfTheCut(f.st.Keep.Base, policy.KeptCost(live), f.e.proxyThreshold(f.r.Profile.ContextWindow))
	live, removed, ledger := f.e.priced(live, f.r.Profile, !cold, f.turnAt, f.ledger, f.suffix(live), postpones)
	f.ledger = ledger
	if len(removed) > 0 {
		f.removed(removed)
		f.kt.InvalidateBase()
	}
	return live
}

// suffix estimates the prompt's tokens from message i of live on.
func (f *proxyTurn) suffix(live []chat.Message) func(i int) int {
	return func(i int) int {
		if i == 0 {
			n, _ := f.estimate(live) // from the measured base
			return n
		}
		n := 0
		if f.r.Estimate != nil {
			n = f.r.Estimate(i)
		}
		eachImage(live[i:], func(_ wire.Pos, img chat.Image) { n += f.imageCost(img) })
		return n
	}
}

// priced is the removal by price both paths share: only where images are
// held (KeepConfig.Holds); until is where the human's current turn starts.
func (e *Engine) priced(live []chat.Message, p tokens.Profile, warm bool, until int, l policy.Ledger, suffix func(int) int, postpones bool) ([]chat.Message, []policy.Removal, policy.Ledger) {
	if !e.Keep.Holds(p) {
		l, _ = l.Count(warm, until) // the budget's cold-start batch reads the pace (policy.ColdBatchPays)
		return live, nil, l
	}
	pr := e.pricing(p, warm, until, suffix)
	pr.Postpones = postpones
	return pr.Decide(live, l)
}

func (e *Engine) pricing(p tokens.Profile, warm bool, until int, suffix func(int) int) policy.Priced {
	costs, _ := policy.CostsOf(p)
	return policy.Priced{Sight: e.Keep.Sight, Costs: costs, Warm: warm, Until: until, Limit: p.Limits.MaxImages, Suffix: suffix}
}

// imageLimit keeps the request under the provider's image limit, in one
// batch: where images are held, down to what price says
// (policy.Priced.UnderLimit), else to the low-water mark of the limit.
func (e *Engine) imageLimit(live []chat.Message, p tokens.Profile, warm bool, until int, l policy.Ledger, suffix func(int) int) ([]chat.Message, []policy.Removal) {
	if e.Keep.Holds(p) {
		return e.pricing(p, warm, until, suffix).UnderLimit(live, l)
	}
	limit := p.Limits.MaxImages
	return policy.ImageLimit(live, limit, int(e.lowWater()*float64(limit)), reason.ProviderLimit)
}

// relayTurn hands the tool images of the current turn to keeping: one seen
// before keeps its occurrence (applyDecisions put it back); a new one is
// relayed.
func (f *proxyTurn) relayTurn(live []chat.Message) []chat.Message {
	return editImages(live, func(at wire.Pos, img chat.Image) (chat.Part, bool) {
		if at.Msg <= f.turnAt || img.Origin != chat.FromTool || img.Occ > 0 || img.Keep == chat.Kept {
			return nil, false
		}
		// Not an event of its own: the gateway stored the bytes, and
		// counted them, as it read the request; the turn reports the trial.
		return f.kt.Relay(img), true
	})
}

// relieve applies window pressure before sending: past the compaction
// threshold, kept images leave first, then the user's images of earlier
// turns (never the current turn's), oldest first, in one batch down to
// the low-water mark. The proxy cannot summarise (the client owns the
// history): what is still too long is the upstream's to refuse. Where the
// client compacts when refused and its compaction costs less
// (compactionPays), nothing leaves: the refusal is the client's.
func (f *proxyTurn) relieve(live []chat.Message) []chat.Message {
	est, measured := f.estimate(live)
	limit := f.e.proxyThreshold(f.r.Profile.ContextWindow)
	if est <= limit || !measured || f.textFills(live) {
		// Without a measured prompt to add to (the client cut its history
		// — a compaction's summary request, say — or a batch just changed
		// it), the estimate counts the JSON's characters and runs well
		// over the real count: a removal on it broke the cached prefix of
		// the client's summary request, which rewrote the conversation.
		// What is really too long the reactive net answers (Overflow).
		return live
	}
	budget := f.budget()
	lowKept := int(f.e.lowWater() * float64(budget))
	p := policy.Pressure{Estimate: est, Threshold: limit, LowWater: limit - budget + lowKept}
	if f.e.Keep.Holds(f.r.Profile) {
		// Kept images may be far over the budget: the batch takes them
		// down to its low-water mark, so the next one is far off.
		p.LowWater = min(p.LowWater, est-max(0, policy.KeptCost(live)-lowKept))
	}
	if f.compactionPays(est, p.LowWater, limit) {
		f.compacts = true
		return live
	}
	live, removed, after := policy.EvictImages(live, p, reason.Window)
	if after > p.LowWater {
		var more []policy.Removal
		live, more = f.removeHistory(live, after-p.LowWater, false, reason.Window)
		removed = append(removed, more...)
	}
	if len(removed) > 0 {
		f.removed(removed)
		f.kt.InvalidateBase()
	}
	return live
}

// compactionPays reports whether the client's own compaction, which the
// provider's refusal of this request brings (claude-code 2.1.332 compacts
// on it), costs less than relieving the window (its usable share limit)
// down to after tokens (policy.Costs.CompactionPays): only with proxy.client_window on, the
// client taken to compact when refused until it shows it does not, and
// prices to weigh.
func (f *proxyTurn) compactionPays(est, after, limit int) bool {
	costs, ok := policy.CostsOf(f.r.Profile)
	base := f.kt.Snapshot().Base
	if !f.e.ProxyClientWindow || !ok || !base.Valid || est <= f.r.Profile.ContextWindow {
		return false // a relief before the window (proxy.window_relief) is the user's
	}
	if f.st.LeftAt > 0 && len(f.r.Messages) >= f.st.LeftAt {
		// A refusal left to it came back as long or longer: a client
		// that does not compact (the summary request of one that does
		// replaces the refused request's last messages with its ask).
		return false
	}
	return costs.CompactionPays(est, after, limit, est-base.Prompt, !f.idle)
}

// textFills reports whether the conversation's text — its measured
// prompt less the images it carries — fills more than half the window, so
// that taking images out at the window only puts the client's compaction
// off, by a few requests each reading nearly the whole window, a cold start
// among them writing it; or, for a client that never compacts, the refusal
// its text soon brings anyway. There the window's refusal is the client's
// (claude-code 2.1.332 compacts on it), and neither the relief nor the
// reactive net removes images.
func (f *proxyTurn) textFills(live []chat.Message) bool {
	images := 0
	eachImage(live, func(_ wire.Pos, img chat.Image) { images += f.imageCost(img) })
	return policy.PastHalfTheCut(f.st.Keep.Base, images, f.r.Profile.ContextWindow)
}

// PastClientWindow reports whether the request as the client sent it, the
// images imgctx took out back in, is past the window, where the
// conversation's text fills over half of it (textFills): without imgctx
// the provider would have refused it (Config.ProxyClientWindow). It counts
// from the last request's measured prompt as sent: what the client
// appended since, at full cost, and the images that request did not carry
// either. Only where imgctx took an image out: the estimate of what was
// appended may run over the provider's count, and with nothing taken out
// it refused a request the provider would have taken (coding at seed 3,
// the dial at its top: the agent compacting one request early).
func (f *proxyTurn) PastClientWindow() (int, bool) {
	live, base := f.Messages, f.st.Keep.Base
	if !base.Valid || base.Messages > len(live) || !f.textFills(live) {
		return 0, false
	}
	n := base.Prompt
	if f.r.Estimate != nil {
		n += f.r.Estimate(base.Messages)
	}
	now := map[blob.Ref]bool{} // taken out by this request: the last one carried them
	for _, ev := range f.Events {
		if ev.Kind == "removed" {
			now[ev.Ref] = true
		}
	}
	out := false
	eachImage(f.r.Messages, func(at wire.Pos, img chat.Image) {
		_, marker := wire.At(live, at).(chat.Marker)
		out = out || marker
		if at.Msg >= base.Messages || marker && !now[img.Ref] {
			n += f.imageCost(img)
		}
	})
	return n, out && n > f.r.Profile.ContextWindow
}

// proxyRelief is the default share of the window past which the proxy
// relieves window pressure (proxy.window_relief): the window itself. The
// client compacts its own history — opencode and claude-code 2.0.77 before
// the window's last 5%, claude-code 2.1.332 only when refused — so a relief
// before the window only postponed it, and the requests it added read
// nearly the whole window (simulate's coding workload, BENCHMARKS.md).
// Past the window, where the provider would refuse, the relief still
// keeps a client that never compacts going, but where the conversation's
// text fills the window's half (textFills).
const proxyRelief = 1.0

func (e *Engine) proxyThreshold(window int) int {
	return int(e.WindowRelief() * float64(window))
}

// WindowRelief is the share of the window past which the proxy relieves
// window pressure: ProxyRelief (default 1), or CompactThreshold if
// higher.
func (c Config) WindowRelief() float64 {
	relief := c.ProxyRelief
	if relief <= 0 {
		relief = proxyRelief
	}
	return max(c.compactShare(), relief)
}

// imageLimit keeps the request under the provider's image count, in
// batches (policy.ImageLimit).
func (f *proxyTurn) imageLimit(live []chat.Message, cold bool) []chat.Message {
	live, removed := f.e.imageLimit(live, f.r.Profile, !cold, f.turnAt, f.ledger, f.suffix(live))
	if len(removed) > 0 {
		f.removed(removed)
		f.kt.InvalidateBase()
	}
	return live
}

// byteLimit keeps the request under the provider's request size: past
// it, kept images and then the user's images of earlier turns leave,
// oldest first, in one batch down to the low-water mark of the limit
// (reason provider_limit). An image weighs its base64; one not sent any
// more (a marker now) weighs nothing.
func (f *proxyTurn) byteLimit(live []chat.Message) []chat.Message {
	limit := f.r.Profile.Limits.MaxRequestBytes
	if limit <= 0 || f.r.Bytes <= limit {
		return live
	}
	size := f.r.Bytes
	eachImage(f.r.Messages, func(at wire.Pos, img chat.Image) {
		if _, ok := wire.At(live, at).(chat.Marker); ok {
			size -= int64(base64.StdEncoding.EncodedLen(int(img.Bytes)))
		}
	})
	if size <= limit {
		return live
	}
	target := int64(f.e.lowWater() * float64(limit))
	more := func(img chat.Image) bool {
		if size <= target {
			return false
		}
		size -= int64(base64.StdEncoding.EncodedLen(int(img.Bytes)))
		return true
	}
	live, removed := f.removeImages(live, isKept, more, reason.ProviderLimit)
	live, others := f.removeImages(live, f.earlierUsers, more, reason.ProviderLimit)
	removed = append(removed, others...)
	if len(removed) > 0 {
		f.removed(removed)
		f.kt.InvalidateBase()
	}
	return live
}

// removeHistory removes the user's images of earlier turns, oldest first,
// until need tokens are freed, or all of them.
func (f *proxyTurn) removeHistory(live []chat.Message, need int, all bool, why reason.Code) ([]chat.Message, []policy.Removal) {
	return f.removeImages(live, f.earlierUsers, func(img chat.Image) bool {
		if need <= 0 && !all {
			return false
		}
		need -= f.imageCost(img)
		return true
	}, why)
}

// earlierUsers selects the user's images of earlier turns (never the
// current turn's, never one decided already).
func (f *proxyTurn) earlierUsers(at wire.Pos, img chat.Image) bool {
	return at.Msg < f.turnAt && img.Keep == ""
}

func isKept(_ wire.Pos, img chat.Image) bool { return img.Keep == chat.Kept }

// removeImages replaces by a marker with why, oldest first, each image pick
// selects while more says the batch goes on (more counts what it frees).
func (f *proxyTurn) removeImages(live []chat.Message, pick func(wire.Pos, chat.Image) bool, more func(chat.Image) bool, why reason.Code) ([]chat.Message, []policy.Removal) {
	var removed []policy.Removal
	out := editImages(live, func(at wire.Pos, img chat.Image) (chat.Part, bool) {
		if !pick(at, img) || !more(img) {
			return nil, false
		}
		removed = append(removed, policy.Removal{Ref: img.Ref, Of: "image", Reason: why, Message: at.Msg, Cost: f.imageCost(img)})
		mk, _ := chat.MarkerFor(img, string(why))
		return mk, true
	})
	return out, removed
}

// estimate is the next prompt's size: the last measured prompt plus what
// was appended since (measured), or an estimate of it all.
func (f *proxyTurn) estimate(live []chat.Message) (n int, measured bool) {
	from := 0
	if b := f.kt.Snapshot().Base; b.Valid && b.Messages <= len(live) {
		from, n, measured = b.Messages, b.Prompt, true
	}
	if f.r.Estimate != nil {
		n += f.r.Estimate(from)
	}
	eachImage(live[from:], func(_ wire.Pos, img chat.Image) { n += f.imageCost(img) })
	return n, measured
}

// send records the request about to go out for measurement.
func (f *proxyTurn) send(live []chat.Message) {
	text := 0
	if from, ok := f.kt.Appended(len(live)); ok && f.r.Text != nil && hasTrial(live) {
		text = f.r.Text(from)
	}
	f.kt.SendingText(live, text)
	f.Messages = live
}

func hasTrial(msgs []chat.Message) bool {
	trial := false
	eachImage(msgs, func(_ wire.Pos, img chat.Image) { trial = trial || img.Keep == chat.Trial })
	return trial
}

func (f *proxyTurn) emit(ev Event) {
	f.Events = append(f.Events, ev)
	if f.e.Sink != nil {
		f.e.Sink(ev)
	}
}

// removed records first removals: not sent, and an event each.
func (f *proxyTurn) removed(rs []policy.Removal) {
	for _, r := range rs {
		f.NotSent = append(f.NotSent, r)
		f.emit(Event{Kind: "removed", Ref: r.Ref, Reason: r.Reason, Tokens: r.Cost, Detail: r.Of})
	}
}

// Observe takes the upstream's answer to the request: its usage measures
// the trial images it showed for the first time (nil usage or a cut
// completion: no measurement).
func (f *proxyTurn) Observe(u *chat.Usage, cut bool) {
	f.kt.Observe(u, cut)
	f.Messages = f.kt.Rewritten(f.Messages)
	for _, ev := range f.kt.Events() {
		f.emit(Event{Kind: ev.Kind, Ref: ev.Ref, Reason: ev.Reason, Tokens: ev.Cost})
	}
	if u != nil {
		f.Break = f.breakOf(*u)
		f.st.LastUsage = *u
	}
}

// breakOf says whether the answer's usage shows a prefix break, and its
// cause: the provider read less of its cache than the previous request
// read or wrote there (explicit caches), or than the previous prompt
// (automatic ones, within two 128-token blocks of their granularity).
func (f *proxyTurn) breakOf(u chat.Usage) string {
	prev := f.st.LastUsage
	expect, slack := prev.CacheRead+prev.CacheWrite, 0
	if f.r.Profile.Cache.Breakpoints == 0 {
		expect, slack = prev.Prompt, 256
		if prev.Prompt < 1024 {
			expect = 0 // too short to be cached
		}
	}
	if expect == 0 || u.CacheRead+slack >= expect {
		return ""
	}
	if f.idle {
		return "expired" // removals at a cold start break nothing more
	}
	for _, ev := range f.Events {
		if ev.Kind == "removed" {
			return "image"
		}
	}
	return "other"
}

// Overflow answers a prompt-too-long: the request without its kept images
// and the user's images of earlier turns, in one batch (reason overflow).
// It reports false when there is nothing left to remove — the upstream's
// error is then the answer; an identical replay would fail again.
func (f *proxyTurn) Overflow() bool {
	if f.compacts || f.textFills(f.Messages) {
		return false // the client's to answer: it compacts, or would have failed without imgctx too
	}
	live, removed := policy.RemoveKept(f.Messages, reason.Overflow)
	live, more := f.removeHistory(live, 0, true, reason.Overflow)
	removed = append(removed, more...)
	if len(removed) == 0 {
		return false
	}
	f.removed(removed)
	// Not to the sink: the gateway counts the replay with its outcome.
	f.Events = append(f.Events, Event{Kind: "retried", Reason: reason.Overflow, Detail: fmt.Sprintf("prompt too long: replay without %d images", len(removed))})
	f.kt.InvalidateBase()
	f.send(live)
	return true
}

// FilesFrom is the first message whose images go by file id. An image
// sent as base64 inside the provider's cached prefix keeps that form, or
// switching would break the prefix; a removal batch breaks it anyway from
// its first marker on, and from there images switch with it. Once an image
// went by file id it stays so.
func (f *proxyTurn) FilesFrom() int {
	from := f.filesFrom
	removed := map[blob.Ref]bool{}
	for _, ev := range f.Events {
		if ev.Kind == "removed" {
			removed[ev.Ref] = true
		}
	}
	if len(removed) == 0 {
		return from
	}
	eachPart(f.Messages, func(at wire.Pos, p chat.Part) {
		if m, ok := p.(chat.Marker); ok && m.Of == "image" && removed[m.Ref] {
			from = min(from, at.Msg)
		}
	})
	return from
}

// Discard ends a request whose decisions are not the conversation's: a
// token count or a compaction asked of the provider gets the images the
// real request would get, and changes nothing.
func (f *proxyTurn) Discard() { f.closed = true }

// Settle makes the decisions the conversation's, for its next request to
// start from: in this process at once, and in the session store now when
// it is shared (the next request may reach another replica), else at
// Close. Close settles them when nothing did (whether or not the upstream
// answered: a retry must see the same body).
func (f *proxyTurn) Settle(ctx context.Context) error {
	if f.closed || f.settled {
		return nil
	}
	f.settled = true
	st := f.decided(ctx)
	f.en.mu.Lock()
	defer f.en.mu.Unlock()
	var err error
	f.unwritten, err = f.en.save(ctx, f.e.Sessions, st)
	return err
}

// Close settles the decisions if nothing did, and writes them to the
// session store when they changed.
func (f *proxyTurn) Close(ctx context.Context) error {
	if f.closed {
		return nil
	}
	err := f.Settle(ctx)
	f.closed = true
	if err != nil || !f.unwritten {
		return err
	}
	f.en.mu.Lock()
	defer f.en.mu.Unlock()
	return f.en.write(ctx, f.e.Sessions)
}

// decided is the conversation's state after this request.
func (f *proxyTurn) decided(ctx context.Context) session.Proxied {
	snap := f.kt.Snapshot()
	if snap.Vouched {
		f.e.seeing.Store(f.r.Tenant+"\x00"+f.r.Profile.Name, true)
	}
	st := session.Proxied{Model: f.r.Model, Messages: len(f.r.Messages), TurnAt: f.turnAt, Turn: &snap,
		Keep: policy.KeepState{EngineBlind: snap.Blind, Base: snap.Base, Vouched: snap.Vouched, Ledger: f.ledger}, LastUsage: f.st.LastUsage, LastActivity: f.e.now().UTC()}
	if f.r.Files {
		from := f.FilesFrom()
		st.FilesFrom = &from
	}
	st.LeftAt = f.st.LeftAt
	if f.left {
		st.LeftAt = len(f.r.Messages)
	}
	// Every edit replaced a part in place: what stands where the client
	// sent an image is what was decided for it.
	eachImage(f.r.Messages, func(at wire.Pos, sent chat.Image) {
		d := session.Decided{Msg: at.Msg, Part: at.Part, Nested: at.Nested, Ref: sent.Ref}
		switch p := wire.At(f.Messages, at).(type) {
		case chat.Marker:
			d.Keep, d.Reason = chat.Removed, reason.Code(p.Reason)
		case chat.Image:
			if p.Keep != chat.Kept && p.Occ == 0 {
				return // the user's, sent as it came: nothing decided
			}
			d.Keep, d.Cost, d.Occ = p.Keep, p.Cost, p.Occ
		default:
			return
		}
		st.Images = append(st.Images, d)
	})
	if len(st.Images) > f.e.proxyMaxImages() {
		f.e.log().WarnContext(ctx, "proxied conversation over its decision cap: its decisions start over", "images", len(st.Images), "cap", f.e.proxyMaxImages())
		st = session.Proxied{TurnAt: -1, LastActivity: st.LastActivity}
	}
	return st
}
