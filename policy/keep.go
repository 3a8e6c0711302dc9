package policy

import (
	"math"
	"strings"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
)

// KeepConfig tunes keeping tool images across turns. Zero fields take the
// defaults.
type KeepConfig struct {
	// BudgetFraction is the share of the context window that kept images may
	// use; default 0.10.
	BudgetFraction float64
	// MinShare is the measured share, in tokens, under which an image is
	// taken as unseen by the engine; default 16.
	MinShare int
	// Hold keeps every measured tool image, over the budget too, and lets
	// price decide when kept images leave (Priced, at Sight): taking an
	// image out breaks the cached prefix from that image on, which may
	// cost more than reading it again. Window pressure, the provider's
	// limits and a prompt too long still remove in batches. Without
	// prices (a profile that has none, or no cache discount) the budget
	// applies at each turn as it comes.
	Hold bool
	// Sight is what showing a kept image for one more request is worth,
	// as a multiple of what reading it from the cache costs: 0 is the
	// cheapest (an earlier turn's image leaves as soon as holding it has
	// cost one break), 1 the default (never pay a break to stop reading
	// an image; drop them at a cold start), larger values keep images
	// past cold starts when the conversation's pace says they will be
	// read long enough. Only with Hold.
	Sight float64
	// HourCache lets the sessions API, which owns its requests' cache
	// breakpoints, give them the provider's one-hour lifetime (Anthropic)
	// once the conversation's pace pays for it: a turn that came after the
	// default lifetime and within the hour (Ledger.LongGaps).
	HourCache bool
}

// Holds says whether images over the budget are held, and leave by price,
// for that profile. Not without prices; and not at a Sight of exactly 1
// where a break costs next to nothing (automatic prefix caches: OpenAI,
// Gemini): holding and removing then cost the same per image shown, every
// policy lies on one line, and the budget picks the point on it, applied
// at each turn as it comes.
func (c KeepConfig) Holds(p tokens.Profile) bool {
	costs, priced := CostsOf(p)
	return c.Hold && priced && (costs.Whole || c.Sight != 1)
}

func (c KeepConfig) fraction() float64 {
	if c.BudgetFraction > 0 {
		return c.BudgetFraction
	}
	return 0.10
}

// Budget is what kept images may cost in a window of that many tokens.
func (c KeepConfig) Budget(window int) int { return int(c.fraction() * float64(window)) }

func (c KeepConfig) minShare() int {
	if c.MinShare > 0 {
		return c.MinShare
	}
	return 16
}

// Storer stores the bytes of a relayed image by reference (sealed when the
// store encrypts, date refreshed, re-read byte-exact). The engine holds the
// bytes; the policy only needs to know whether storing worked.
type Storer interface {
	StoreImage(ref blob.Ref) error
}

// KeepState is what keeping learns across turns; the engine persists it.
type KeepState struct {
	// EngineBlind is learned: a measured share under the threshold shows the
	// engine ignores images, and keeping stops for the session.
	EngineBlind bool `json:"engine_blind"`
	// Base is the previous request, the reference a measurement needs.
	Base Base `json:"base"`
	// Vouched is learned too: an image of the conversation was measured,
	// so the engine sees them (an unmeasured one may then be kept).
	Vouched bool `json:"vouched,omitempty"`
	// Ledger is what pricing removals remembers (Priced); the engine
	// carries it across requests, KeepTurn never reads it.
	Ledger Ledger `json:"ledger,omitzero"`
}

// Base is a request whose prompt size is known: later usage deltas are
// measured against it.
type Base struct {
	Valid    bool `json:"valid"`
	Prompt   int  `json:"prompt"`   // prompt tokens the engine reported for it
	Messages int  `json:"messages"` // how many messages it carried
}

// Turn describes the turn keeping runs in.
type Turn struct {
	Config  KeepConfig
	Profile tokens.Profile // context window and vision
	Thread  chat.Thread    // only the main thread keeps images
	Switch  bool           // the keep-turn-images switch
	State   KeepState
	Counter tokens.TextCounter // counts text appended between requests
	Storer  Storer
	// Cut is the prompt size at which the history will be cut: the
	// compaction threshold (sessions API) or the window relief the client's
	// own compaction comes before (proxy). 0: unknown, the budget applies.
	Cut int
}

// Postpones reports whether taking kept images out by the budget would
// only postpone the history's cut, not save (priced removals weigh the
// same, Priced.Postpones): removing x tokens shifts the
// conversation's sawtooth of prompt sizes x ÷ growth requests later, which
// saves (x ÷ growth) × (the prompt at the conversation's end − the prompt
// now) tokens read. A conversation whose text has grown past half the cut
// is taken to go on about as long again (its text would then pass the
// cut), so its end lands anywhere on the sawtooth, below the prompt now on
// average: the removal costs reads instead of saving them (BENCHMARKS.md,
// the coding bullets). Only where images are priced and not held (held
// images leave by price).
func (t Turn) Postpones(kept int) bool {
	if t.Config.Holds(t.Profile) {
		return false
	}
	if _, priced := CostsOf(t.Profile); !priced {
		return false
	}
	return PastHalfTheCut(t.State.Base, kept, t.Cut)
}

// PastHalfTheCut reports whether a conversation's text — the measured
// prompt of base less the kept images' cost — is past half of cut, the
// prompt size at which its history will be cut (Turn.Postpones). False
// without a measured prompt or a cut.
func PastHalfTheCut(base Base, kept, cut int) bool {
	return cut > 0 && base.Valid && 2*(base.Prompt-kept) > cut
}

// KeepEvent is one keep decision, for logs, metrics and the turn's events.
type KeepEvent struct {
	Kind   string // "trial", "kept", "ephemeral", "refused"
	Ref    blob.Ref
	Reason reason.Code // why the image is ephemeral (or refused)
	Cost   int         // measured share, for "kept" and measured refusals
}

type relayed struct {
	ref      blob.Ref
	bytes    int64
	keep     chat.Keep
	why      reason.Code
	cost     int
	estimate int  // its tokens by the profile's rule, for when it goes unmeasured
	observed bool // a request showing it has been observed
}

// KeepTurn is the per-turn state of keeping tool images (seed
// keep-turn-images): Start, then Relay for each tool image, Sending before
// and Observe after each request, Rewritten and Publishable mid-turn, Finish
// at the end. Not safe for concurrent use: one turn runs one request at a
// time.
type KeepTurn struct {
	t       Turn
	off     reason.Code // why keeping is off for this turn; "" when on
	budget  int         // tokens left for newly kept images
	stopped bool        // the store refused an image: no more keeping this turn
	base    Base
	blind   bool
	vouched bool             // an image of this conversation was measured: the engine sees them
	relays  map[int]*relayed // by occurrence (chat.Image.Occ)
	order   []int
	pending []int // trial occurrences the last Sending shows for the first time
	text    int   // text tokens that request appended since the base
	sent    int   // messages that request carries; the base's once observed
	events  []KeepEvent
}

// StartTurn begins a turn. The budget is BudgetFraction of the window minus
// the measured cost of the images history already keeps.
func StartTurn(t Turn) *KeepTurn {
	if t.Counter == nil {
		t.Counter = tokens.Chars4{}
	}
	k := &KeepTurn{t: t, base: t.State.Base, blind: t.State.EngineBlind, vouched: t.State.Vouched, relays: map[int]*relayed{}}
	switch {
	case !t.Switch || t.Thread != chat.Main:
		k.off = reason.KeyOff
	case !t.Profile.Vision || t.State.EngineBlind:
		k.off = reason.NoVision
	}
	return k
}

// Start applies turn start to the history: kept images leave when the switch
// is off (key_off) or vision is absent (no_vision); their caption stays in
// the marker. It returns the history, what left, and sets the budget from
// what stays.
func (k *KeepTurn) Start(msgs []chat.Message) ([]chat.Message, []Removal) {
	var removed []Removal
	out := msgs
	if k.off != "" { // keeping is off: the kept images leave (else nothing to walk for)
		out = editImages(msgs, func(i int, img chat.Image) ([]chat.Part, bool) {
			if img.Keep != chat.Kept {
				return nil, false
			}
			removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: k.off, Message: i, Cost: img.Cost})
			return markerFor(img, k.off), true
		})
	}
	kept := KeptCost(out)
	k.budget = k.t.Config.Budget(k.t.Profile.ContextWindow) - kept
	k.vouched = k.vouched || kept > 0
	if k.t.Config.Holds(k.t.Profile) || k.t.Postpones(kept) {
		k.budget = math.MaxInt / 4 // held (applied in batches, by the caller), or past the point where the budget pays
	}
	if len(removed) > 0 {
		k.base.Valid = false // the prefix changed: the old prompt size no longer applies
	}
	return out, removed
}

// KeptCost is the measured cost of the images msgs keeps.
func KeptCost(msgs []chat.Message) int {
	n := 0
	eachImage(msgs, func(_ int, img chat.Image) {
		if img.Keep == chat.Kept {
			n += img.Cost
		}
	})
	return n
}

// Budget is what newly kept images may still cost this turn.
func (k *KeepTurn) Budget() int { return k.budget }

// Relay takes an image arriving in a tool result. When keeping is possible
// it is stored by reference and becomes a trial; otherwise, or when the
// store refuses it, it stays ephemeral (sent during this turn only). A
// refusal stops keeping for the rest of the turn. Each call is a new
// occurrence (img.Occ): the same screenshot shown twice is decided twice.
func (k *KeepTurn) Relay(img chat.Image) chat.Image {
	img.Origin = chat.FromTool
	img.Occ = len(k.order) + 1
	r := &relayed{ref: img.Ref, bytes: img.Bytes, keep: chat.Ephemeral}
	if n, err := tokens.ImageTokens(k.t.Profile, img.Width, img.Height, img.Detail); err == nil {
		r.estimate = n
	}
	switch {
	case k.off != "":
		r.why = k.off
	case k.stopped:
		r.why = reason.Refused
	case k.budget <= 0:
		r.why = reason.Budget // full before storing: not even stored
	default:
		if err := k.t.Storer.StoreImage(img.Ref); err != nil {
			k.stopped = true
			r.why = reason.Refused
			k.events = append(k.events, KeepEvent{Kind: "refused", Ref: img.Ref, Reason: reason.Refused})
		} else {
			r.keep = chat.Trial
			k.events = append(k.events, KeepEvent{Kind: "trial", Ref: img.Ref})
		}
	}
	k.order = append(k.order, img.Occ)
	k.relays[img.Occ] = r
	img.Keep = r.keep
	return img
}

// relay is the relayed occurrence img is, or nil (an image of history, or
// one not relayed by this turn).
func (k *KeepTurn) relay(img chat.Image) *relayed {
	if r := k.relays[img.Occ]; img.Occ > 0 && r != nil && r.ref == img.Ref {
		return r
	}
	return nil
}

// Sending records a request about to go out: the trial images it shows for
// the first time and the text it appended since the base (content and
// per-message framing, as providers bill them). A retried request calls
// Sending again and is measured once, on the attempt that succeeds.
func (k *KeepTurn) Sending(msgs []chat.Message) {
	text := 0
	if from, ok := k.Appended(len(msgs)); ok {
		for _, m := range msgs[from:] {
			text += TextTokens(m.Parts, k.t.Counter) + tokens.MessageFraming
		}
	}
	k.SendingText(msgs, text)
}

// Appended says from which message a request of n messages appends to the
// base, when it has one: the text from there is what a measurement
// subtracts.
func (k *KeepTurn) Appended(n int) (int, bool) {
	if k.base.Valid && k.base.Messages <= n {
		return k.base.Messages, true
	}
	return 0, false
}

// SendingText is Sending with the appended text counted by the caller (the
// proxy counts it from the client's bytes), framing included.
func (k *KeepTurn) SendingText(msgs []chat.Message, text int) {
	k.pending = k.pending[:0]
	seen := map[int]bool{}
	eachImage(msgs, func(_ int, img chat.Image) {
		if r := k.relay(img); r != nil && r.keep == chat.Trial && !r.observed && !seen[img.Occ] {
			seen[img.Occ] = true
			k.pending = append(k.pending, img.Occ)
		}
	})
	k.text = text
	k.sent = len(msgs) // the base moves only when the request is observed
}

// TextTokens counts what parts carry as text, images excluded, nested
// parts included. A tool result's name is not counted: neither wire format
// sends it.
func TextTokens(parts []chat.Part, c tokens.TextCounter) int {
	n := 0
	chat.Walk(parts, func(p chat.Part, _ int) bool {
		switch p := p.(type) {
		case chat.Text:
			n += c.Count(p.Text)
		case chat.ToolCall:
			n += c.Count(p.Name) + c.Count(p.Arguments)
		case chat.Summary:
			n += c.Count(p.Text)
		case chat.Marker:
			n += c.Count(p.String())
		case chat.Document:
			n += c.Count(p.Text)
		case chat.Opaque:
			n += c.Count(p.Raw) // thinking and server-tool blocks are billed as input
		}
		return true
	})
	return n
}

// Observe takes the usage of the request Sending described, once it
// succeeded. The measured image tokens (prompt − base prompt − appended
// text) are shared among the images shown for the first time, pro rata by
// bytes: a share under MinShare means the engine does not see images; a
// share over the budget stays ephemeral; otherwise the image is kept at its
// measured cost. No usage (u nil), a cut completion, or no base: no
// measurement, and the images stay on trial.
func (k *KeepTurn) Observe(u *chat.Usage, cut bool) {
	pending := k.pending
	k.pending = nil
	for _, occ := range pending {
		k.relays[occ].observed = true
	}
	if u == nil {
		k.base = Base{}
		return
	}
	measurable := k.base.Valid && !cut && len(pending) > 0
	delta := u.Prompt - k.base.Prompt - k.text
	k.base = Base{Valid: true, Prompt: u.Prompt, Messages: k.sent}
	if !measurable {
		return
	}
	var total int64
	for _, occ := range pending {
		total += max(k.relays[occ].bytes, 1)
	}
	for _, occ := range pending {
		r := k.relays[occ]
		ref := r.ref
		share := 0
		if delta > 0 {
			share = int(int64(delta) * max(r.bytes, 1) / total)
		}
		switch {
		case share < k.t.Config.minShare():
			r.keep, r.why, r.cost = chat.Ephemeral, reason.BelowThreshold, share
			k.blind = true
			k.off = reason.NoVision
		case share > k.budget:
			r.keep, r.why, r.cost = chat.Ephemeral, reason.Budget, share
		default:
			r.keep, r.cost = chat.Kept, share
			k.budget -= share
			k.vouched = true
			k.events = append(k.events, KeepEvent{Kind: "kept", Ref: ref, Cost: share})
			continue
		}
		k.events = append(k.events, KeepEvent{Kind: "ephemeral", Ref: ref, Reason: r.why, Cost: share})
	}
}

// InvalidateBase forgets the base, for when the engine rewrote the prefix
// (eviction, compaction): the next request cannot be measured against it.
func (k *KeepTurn) InvalidateBase() { k.base = Base{} }

// Rewritten returns msgs with the keep state and measured cost of this
// turn's relayed images applied. Mid-turn, ephemeral images are still sent.
func (k *KeepTurn) Rewritten(msgs []chat.Message) []chat.Message {
	if len(k.relays) == 0 {
		return msgs // no image relayed this turn: a long history is not walked for none
	}
	return editImages(msgs, func(_ int, img chat.Image) ([]chat.Part, bool) {
		r := k.relay(img)
		if r == nil || (img.Keep == r.keep && img.Cost == r.cost) {
			return nil, false
		}
		img.Keep, img.Cost = r.keep, r.cost
		if r.keep != chat.Kept {
			img.Cost = 0
		}
		return []chat.Part{img}, true
	})
}

// Publishable is the history to publish mid-turn (to the store, the API,
// the UI): rewritten, without the relayed images that are not kept yet.
func (k *KeepTurn) Publishable(msgs []chat.Message) []chat.Message {
	return editImages(k.Rewritten(msgs), func(_ int, img chat.Image) ([]chat.Part, bool) {
		if r := k.relay(img); r != nil && r.keep != chat.Kept {
			return nil, true
		}
		return nil, false
	})
}

// Finish ends the turn: a trial image never measured becomes ephemeral
// (unmeasured) — unless images are held (Hold) and an image of this
// conversation was measured already: the engine sees images then, and
// removing it would break the cached prefix for nothing, so it is kept at
// its estimated cost. Every ephemeral image is replaced by a marker that
// keeps its caption. It returns the history for the next turn, what was
// removed, and the state to persist.
func (k *KeepTurn) Finish(msgs []chat.Message) ([]chat.Message, []Removal, KeepState) {
	for _, occ := range k.order {
		r := k.relays[occ]
		switch {
		case r.keep != chat.Trial:
		case k.vouched && r.estimate > 0 && k.t.Config.Holds(k.t.Profile):
			r.keep, r.cost = chat.Kept, r.estimate
			k.events = append(k.events, KeepEvent{Kind: "kept", Ref: r.ref, Cost: r.estimate})
		default:
			r.keep, r.why = chat.Ephemeral, reason.Unmeasured
			k.events = append(k.events, KeepEvent{Kind: "ephemeral", Ref: r.ref, Reason: reason.Unmeasured})
		}
	}
	if len(k.relays) == 0 {
		return msgs, nil, KeepState{EngineBlind: k.blind, Base: k.base, Vouched: k.vouched}
	}
	var removed []Removal
	out := editImages(k.Rewritten(msgs), func(i int, img chat.Image) ([]chat.Part, bool) {
		r := k.relay(img)
		if r == nil {
			return nil, false
		}
		if r.keep != chat.Ephemeral {
			img.Occ = 0 // kept: history now, outside any turn's relays
			return []chat.Part{img}, true
		}
		removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: r.why, Message: i})
		return markerFor(img, r.why), true
	})
	if len(removed) > 0 {
		k.base.Valid = false // the next prompt differs inside the old prefix
	}
	return out, removed, KeepState{EngineBlind: k.blind, Base: k.base, Vouched: k.vouched}
}

// Events returns the decisions made so far, in order.
func (k *KeepTurn) Events() []KeepEvent { return k.events }

// TurnSnapshot is a KeepTurn at rest: a turn spans several calls when the
// client runs the tools, and a process may restart between them.
type TurnSnapshot struct {
	Off     reason.Code     `json:"off,omitempty"`
	Budget  int             `json:"budget"`
	Stopped bool            `json:"stopped,omitempty"`
	Base    Base            `json:"base"`
	Blind   bool            `json:"blind,omitempty"`
	Vouched bool            `json:"vouched,omitempty"`
	Relays  []RelaySnapshot `json:"relays,omitempty"`
	Pending []int           `json:"pending,omitempty"` // occurrences
	Text    int             `json:"text,omitempty"`
	Sent    int             `json:"sent,omitempty"`
}

// RelaySnapshot is one relayed image's keep state.
type RelaySnapshot struct {
	Occ      int         `json:"occ"`
	Ref      blob.Ref    `json:"ref"`
	Bytes    int64       `json:"bytes"`
	Keep     chat.Keep   `json:"keep"`
	Why      reason.Code `json:"why,omitempty"`
	Cost     int         `json:"cost,omitempty"`
	Estimate int         `json:"estimate,omitempty"`
	Observed bool        `json:"observed,omitempty"`
}

// Snapshot returns the turn's state; ResumeTurn restores it exactly.
func (k *KeepTurn) Snapshot() TurnSnapshot {
	s := TurnSnapshot{Off: k.off, Budget: k.budget, Stopped: k.stopped, Base: k.base, Blind: k.blind, Vouched: k.vouched,
		Pending: append([]int(nil), k.pending...), Text: k.text, Sent: k.sent}
	for _, occ := range k.order {
		r := k.relays[occ]
		s.Relays = append(s.Relays, RelaySnapshot{Occ: occ, Ref: r.ref, Bytes: r.bytes, Keep: r.keep, Why: r.why, Cost: r.cost, Estimate: r.estimate, Observed: r.observed})
	}
	return s
}

// ResumeTurn rebuilds a turn from its snapshot, in the same Turn setting.
func ResumeTurn(t Turn, s TurnSnapshot) *KeepTurn {
	k := StartTurn(t)
	k.off, k.budget, k.stopped, k.base, k.blind, k.vouched = s.Off, s.Budget, s.Stopped, s.Base, s.Blind, s.Vouched
	k.pending, k.text, k.sent = append([]int(nil), s.Pending...), s.Text, s.Sent
	for _, r := range s.Relays {
		k.order = append(k.order, r.Occ)
		k.relays[r.Occ] = &relayed{ref: r.Ref, bytes: r.Bytes, keep: r.Keep, why: r.Why, cost: r.Cost, estimate: r.Estimate, observed: r.Observed}
	}
	return k
}

// captionRunes bounds a caption taken from the conversation's text.
const captionRunes = 80

// Caption gives each image of m without a caption one from what the
// conversation already says, so that its marker and a later summary can
// name it: the first line of the text beside it (in the same tool result,
// or the same message), else the tool call it answers (name and
// arguments, from call, which may be nil).
func Caption(m chat.Message, call func(id string) (chat.ToolCall, bool)) chat.Message {
	top := firstLine(m.Parts)
	var out []chat.Part
	for i, p := range m.Parts {
		switch p := p.(type) {
		case chat.Image:
			if p.Caption == "" && top != "" {
				p.Caption = top
				out = setPart(out, m.Parts, i, p)
			}
		case chat.ToolResult:
			text := firstLine(p.Parts)
			if text == "" && call != nil {
				if tc, ok := call(p.CallID); ok {
					text = bounded(tc.Name + " " + tc.Arguments)
				}
			}
			changed := false
			nested := p.Parts
			for j, q := range p.Parts {
				if img, ok := q.(chat.Image); ok && img.Caption == "" && text != "" {
					if !changed {
						nested, changed = append([]chat.Part(nil), p.Parts...), true
					}
					img.Caption = text
					nested[j] = img
				}
			}
			if changed {
				p.Parts = nested
				out = setPart(out, m.Parts, i, p)
			}
		}
	}
	if out != nil {
		m.Parts = out
	}
	return m
}

func setPart(out, parts []chat.Part, i int, p chat.Part) []chat.Part {
	if out == nil {
		out = append([]chat.Part(nil), parts...)
	}
	out[i] = p
	return out
}

// firstLine is the first non-empty line of parts' text, bounded.
func firstLine(parts []chat.Part) string {
	for _, p := range parts {
		if t, ok := p.(chat.Text); ok {
			for _, line := range strings.Split(t.Text, "\n") {
				if line = strings.TrimSpace(line); line != "" {
					return bounded(line)
				}
			}
		}
	}
	return ""
}

func bounded(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > captionRunes {
		return string(r[:captionRunes-1]) + "…"
	}
	return s
}
