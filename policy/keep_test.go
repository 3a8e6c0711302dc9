package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"pgregory.net/rapid"
)

// Seed keep-turn-images.md, "Tests / chat/keepimg", case by case:
//
//	clé (the switch)                          TestKeepSwitchOff, TestKeepSubThread
//	gardée au coût mesuré                     TestKeptAtMeasuredCost
//	budget                                    TestKeepBudget
//	sans mesure: pas d'usage                  TestNoMeasurement/no_usage
//	sans mesure: complétion coupée            TestNoMeasurement/cut_completion
//	sans mesure: pas de base                  TestNoMeasurement/no_base
//	requête relancée                          TestRetriedRequestMeasuredOnce
//	rangement refusé                          TestStoreRefusalStopsTheTurn
//	partage entre deux images                 TestShareProRataByBytes
//	publication                               TestPublishableHidesUnkeptRelays
//	réécriture                                TestRewrittenCarriesStateAndCost
//	fin de tour (image à l'essai)             TestFinishTrialNeverMeasured
//	budget plein avant rangement              TestBudgetFullBeforeStoring
//	seuil de 16 jetons (engine sees images)   TestBelowThresholdLearnsBlindness
//	début de tour: clé retirée, vision absente TestTurnStartRemovesKeptImages
//	requête identique avec et sans la clé     TestSwitchChangesNoRequestInsideATurn
//	invariant: budget never exceeded          TestKeptCostNeverExceedsBudget (rapid)

// scriptedEngine prices a request the way a real engine would: text by the
// same counter, each message's framing, images by a true cost per ref, plus
// a fixed overhead. The
// policy never sees trueCost; it must measure it.
type scriptedEngine struct {
	trueCost map[blob.Ref]int
	counter  tokens.TextCounter
}

func (e scriptedEngine) prompt(msgs []chat.Message) int {
	n := 50 // system framing
	for _, m := range msgs {
		n += TextTokens(m.Parts, e.counter) + tokens.MessageFraming
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			if img, ok := p.(chat.Image); ok {
				n += e.trueCost[img.Ref]
			}
			return true
		})
	}
	return n
}

type storer struct {
	stored []blob.Ref
	refuse bool
}

func (s *storer) StoreImage(ref blob.Ref) error {
	if s.refuse {
		return errors.New("disk full")
	}
	s.stored = append(s.stored, ref)
	return nil
}

func shot(name string, bytes int64) chat.Image {
	return chat.Image{Ref: blob.Of([]byte(name)), MediaType: "image/png", Bytes: bytes, Caption: name}
}

func profile(window int) tokens.Profile {
	return tokens.Profile{Name: "test", ContextWindow: window, Vision: true, Tokenizer: "chars4",
		Image: tokens.ImageRule{Rule: "fixed", Tokens: 1000}}
}

// fixture is a turn in progress: the history so far, a measured base, an
// engine and a store.
type fixture struct {
	msgs   []chat.Message
	engine scriptedEngine
	store  *storer
	turn   *KeepTurn
}

func newFixture(switchOn bool, window int, images ...chat.Image) *fixture {
	f := &fixture{
		msgs: []chat.Message{
			{Role: chat.System, Parts: []chat.Part{chat.Text{Text: "You are an agent with a screenshot tool."}}},
			{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "Open the login page and tell me what you see."}}},
		},
		engine: scriptedEngine{trueCost: map[blob.Ref]int{}, counter: tokens.Chars4{}},
		store:  &storer{},
	}
	for _, img := range images {
		f.engine.trueCost[img.Ref] = int(img.Bytes / 10) // any true cost the policy must find
	}
	f.turn = StartTurn(Turn{Profile: profile(window), Thread: chat.Main, Switch: switchOn, Counter: tokens.Chars4{}, Storer: f.store})
	f.msgs, _ = f.turn.Start(f.msgs)
	f.request(false) // the turn's first request: the base
	return f
}

// request sends f.msgs: Sending, then Observe with the engine's usage.
func (f *fixture) request(cut bool) chat.Usage {
	f.turn.Sending(f.msgs)
	u := chat.Usage{Prompt: f.engine.prompt(f.msgs)}
	f.turn.Observe(&u, cut)
	return u
}

// toolStep appends an assistant tool call and a tool result carrying imgs,
// each relayed.
func (f *fixture) toolStep(imgs ...chat.Image) {
	f.msgs = append(f.msgs, chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.ToolCall{ID: "c1", Name: "screenshot", Arguments: "{}"}}})
	parts := []chat.Part{chat.Text{Text: "captured"}}
	for _, img := range imgs {
		parts = append(parts, f.turn.Relay(img))
	}
	f.msgs = append(f.msgs, chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c1", Name: "screenshot", Parts: parts}}})
}

func (f *fixture) finish() ([]chat.Message, []Removal, KeepState) {
	f.msgs = append(f.msgs, chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: "I see a login form."}}})
	return f.turn.Finish(f.msgs)
}

func imagesIn(msgs []chat.Message) (imgs []chat.Image, markers []chat.Marker) {
	for _, m := range msgs {
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			switch p := p.(type) {
			case chat.Image:
				imgs = append(imgs, p)
			case chat.Marker:
				markers = append(markers, p)
			}
			return true
		})
	}
	return imgs, markers
}

func TestKeptAtMeasuredCost(t *testing.T) {
	img := shot("login", 15000) // true cost 1500
	f := newFixture(true, 200000, img)
	f.toolStep(img)
	f.request(false)
	out, removed, _ := f.finish()
	imgs, markers := imagesIn(out)
	if len(imgs) != 1 || imgs[0].Keep != chat.Kept || imgs[0].Cost != 1500 || len(markers) != 0 || len(removed) != 0 {
		t.Fatalf("images %+v markers %+v removed %+v; want one kept at the measured 1500", imgs, markers, removed)
	}
	if len(f.store.stored) != 1 || f.store.stored[0] != img.Ref {
		t.Fatalf("stored %v; want the image stored by ref once", f.store.stored)
	}
}

func TestKeepSwitchOff(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(false, 200000, img)
	f.toolStep(img)
	f.request(false)
	out, removed, _ := f.finish()
	imgs, markers := imagesIn(out)
	if len(imgs) != 0 || len(markers) != 1 || markers[0].Reason != string(reason.KeyOff) || markers[0].Caption != "login" {
		t.Fatalf("images %+v markers %+v", imgs, markers)
	}
	if len(removed) != 1 || removed[0].Reason != reason.KeyOff || len(f.store.stored) != 0 {
		t.Fatalf("removed %+v stored %v", removed, f.store.stored)
	}
}

func TestKeepSubThread(t *testing.T) {
	k := StartTurn(Turn{Profile: profile(100000), Thread: chat.Sub, Switch: true, Storer: &storer{}})
	k.Start(nil)
	if img := k.Relay(shot("x", 100)); img.Keep != chat.Ephemeral {
		t.Fatalf("a sub thread kept an image: %v", img.Keep)
	}
}

func TestKeepBudget(t *testing.T) {
	// Window 20000 → budget 2000. The first image (true 1500) fits; the
	// second (true 1200) does not fit what is left.
	a, b := shot("a", 15000), shot("b", 12000)
	f := newFixture(true, 20000, a, b)
	f.toolStep(a)
	f.request(false)
	f.toolStep(b)
	f.request(false)
	out, removed, _ := f.finish()
	imgs, _ := imagesIn(out)
	if len(imgs) != 1 || imgs[0].Ref != a.Ref || KeptCost(out) != 1500 {
		t.Fatalf("kept %+v", imgs)
	}
	if len(removed) != 1 || removed[0].Ref != b.Ref || removed[0].Reason != reason.Budget {
		t.Fatalf("removed %+v; want b for budget", removed)
	}
}

// A screenshot shown twice is two occurrences: the second refused for
// budget leaves the first kept where it was.
func TestKeepDecidesEachOccurrence(t *testing.T) {
	a := shot("a", 15000) // true 1500 against a budget of 2000
	f := newFixture(true, 20000, a)
	f.toolStep(a)
	f.request(false)
	f.toolStep(a)
	f.request(false)
	out, removed, _ := f.finish()
	imgs, markers := imagesIn(out)
	if len(imgs) != 1 || imgs[0].Keep != chat.Kept || imgs[0].Occ != 0 || len(markers) != 1 {
		t.Fatalf("images %+v markers %+v; want the first kept, the second a marker", imgs, markers)
	}
	if len(removed) != 1 || removed[0].Reason != reason.Budget || removed[0].Message != 5 {
		t.Fatalf("removed %+v; want the second occurrence (message 5) for budget", removed)
	}
}

// In a keep-off session, a tool returning the user's own pasted image does
// not touch the user's copy.
func TestRelayLeavesTheUsersCopy(t *testing.T) {
	a := shot("pasted", 15000)
	f := newFixture(false, 20000, a)
	f.msgs[1].Parts = append(f.msgs[1].Parts, a) // the user pasted it
	f.toolStep(a)
	f.request(false)
	out, removed, _ := f.finish()
	imgs, markers := imagesIn(out)
	if len(imgs) != 1 || imgs[0].Origin != "" || len(markers) != 1 || len(removed) != 1 || removed[0].Reason != reason.KeyOff {
		t.Fatalf("images %+v markers %+v removed %+v; want the user's image kept, the tool's copy key_off", imgs, markers, removed)
	}
}

func TestNoMeasurement(t *testing.T) {
	img := shot("login", 15000)
	t.Run("no usage", func(t *testing.T) {
		f := newFixture(true, 200000, img)
		f.toolStep(img)
		f.turn.Sending(f.msgs)
		f.turn.Observe(nil, false)
		_, removed, _ := f.finish()
		if len(removed) != 1 || removed[0].Reason != reason.Unmeasured {
			t.Fatalf("removed %+v; want unmeasured", removed)
		}
	})
	t.Run("cut completion", func(t *testing.T) {
		f := newFixture(true, 200000, img)
		f.toolStep(img)
		f.request(true)
		_, removed, _ := f.finish()
		if len(removed) != 1 || removed[0].Reason != reason.Unmeasured {
			t.Fatalf("removed %+v; want unmeasured", removed)
		}
	})
	t.Run("no base", func(t *testing.T) {
		f := newFixture(true, 200000, img)
		f.turn.InvalidateBase()
		f.toolStep(img)
		f.request(false)
		_, removed, _ := f.finish()
		if len(removed) != 1 || removed[0].Reason != reason.Unmeasured {
			t.Fatalf("removed %+v; want unmeasured", removed)
		}
	})
}

func TestRetriedRequestMeasuredOnce(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(true, 200000, img)
	f.toolStep(img)
	f.turn.Sending(f.msgs) // attempt 1 fails (429): no Observe
	f.request(false)       // attempt 2 succeeds
	f.request(false)       // a later request shows it again: not re-measured
	out, _, _ := f.finish()
	if imgs, _ := imagesIn(out); len(imgs) != 1 || imgs[0].Cost != 1500 {
		t.Fatalf("cost %+v; want measured once at 1500", imgs)
	}
	kept := 0
	for _, e := range f.turn.Events() {
		if e.Kind == "kept" {
			kept++
		}
	}
	if kept != 1 {
		t.Fatalf("%d kept events; want 1", kept)
	}
}

func TestStoreRefusalStopsTheTurn(t *testing.T) {
	a, b := shot("a", 15000), shot("b", 15000)
	f := newFixture(true, 200000, a, b)
	f.store.refuse = true
	f.toolStep(a)
	f.store.refuse = false // even once the store recovers, keeping stays off this turn
	f.toolStep(b)
	f.request(false)
	_, removed, _ := f.finish()
	if len(removed) != 2 || removed[0].Reason != reason.Refused || removed[1].Reason != reason.Refused {
		t.Fatalf("removed %+v; want both refused", removed)
	}
	if len(f.store.stored) != 0 {
		t.Fatalf("stored %v after a refusal", f.store.stored)
	}
}

func TestShareProRataByBytes(t *testing.T) {
	// Two images first shown by one request: the delta (1500 + 500) is
	// shared 3:1 by bytes.
	a, b := shot("a", 15000), shot("b", 5000)
	f := newFixture(true, 200000, a, b)
	f.toolStep(a, b)
	f.request(false)
	out, _, _ := f.finish()
	imgs, _ := imagesIn(out)
	if len(imgs) != 2 || imgs[0].Cost != 1500 || imgs[1].Cost != 500 {
		t.Fatalf("costs %+v; want 1500 and 500", imgs)
	}
}

func TestPublishableHidesUnkeptRelays(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(true, 200000, img)
	f.toolStep(img)
	pub := f.turn.Publishable(f.msgs)
	if imgs, _ := imagesIn(pub); len(imgs) != 0 {
		t.Fatalf("a trial image was published: %+v", imgs)
	}
	if imgs, _ := imagesIn(f.msgs); len(imgs) != 1 {
		t.Fatal("Publishable changed the live history")
	}
	f.request(false)
	if imgs, _ := imagesIn(f.turn.Publishable(f.msgs)); len(imgs) != 1 || imgs[0].Keep != chat.Kept {
		t.Fatalf("a kept image was not published: %+v", imgs)
	}
}

func TestRewrittenCarriesStateAndCost(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(true, 200000, img)
	f.toolStep(img)
	if imgs, _ := imagesIn(f.turn.Rewritten(f.msgs)); imgs[0].Keep != chat.Trial || imgs[0].Cost != 0 {
		t.Fatalf("before measuring: %+v", imgs[0])
	}
	f.request(false)
	before := chat.CloneMessages(f.msgs)
	rw := f.turn.Rewritten(f.msgs)
	if imgs, _ := imagesIn(rw); imgs[0].Keep != chat.Kept || imgs[0].Cost != 1500 || imgs[0].Ref != img.Ref {
		t.Fatalf("after measuring: %+v", imgs[0])
	}
	if !reflect.DeepEqual(before, f.msgs) {
		t.Fatal("Rewritten mutated its input")
	}
	if again := f.turn.Rewritten(rw); &again[0] != &rw[0] {
		t.Fatal("Rewritten copied a history it did not change")
	}
}

func TestFinishTrialNeverMeasured(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(true, 200000, img)
	f.toolStep(img) // the turn ends before any request shows it
	out, removed, _ := f.finish()
	_, markers := imagesIn(out)
	if len(removed) != 1 || removed[0].Reason != reason.Unmeasured || len(markers) != 1 || markers[0].Caption != "login" {
		t.Fatalf("removed %+v markers %+v", removed, markers)
	}
}

func TestBudgetFullBeforeStoring(t *testing.T) {
	// History already keeps 2000 tokens of images in a 20000 window.
	kept := shot("old", 20000)
	kept.Keep, kept.Cost = chat.Kept, 2000
	st := &storer{}
	k := StartTurn(Turn{Profile: profile(20000), Thread: chat.Main, Switch: true, Storer: st})
	k.Start([]chat.Message{{Role: chat.Tool, Parts: []chat.Part{kept}}})
	if k.Budget() != 0 {
		t.Fatalf("budget %d; want 0", k.Budget())
	}
	if img := k.Relay(shot("new", 100)); img.Keep != chat.Ephemeral || len(st.stored) != 0 {
		t.Fatalf("relay with a full budget: %v, stored %v", img.Keep, st.stored)
	}
}

func TestBelowThresholdLearnsBlindness(t *testing.T) {
	img := shot("login", 15000)
	f := newFixture(true, 200000, img)
	f.engine.trueCost[img.Ref] = 3 // the engine does not really see images
	f.toolStep(img)
	f.request(false)
	later := shot("later", 15000)
	if r := f.turn.Relay(later); r.Keep != chat.Ephemeral {
		t.Fatalf("kept after learning the engine is blind: %v", r.Keep)
	}
	_, removed, st := f.finish()
	if !st.EngineBlind || len(removed) == 0 || removed[0].Reason != reason.BelowThreshold {
		t.Fatalf("state %+v removed %+v", st, removed)
	}
	next := StartTurn(Turn{Profile: profile(200000), Thread: chat.Main, Switch: true, State: st, Storer: &storer{}})
	next.Start(nil)
	if img := next.Relay(shot("next", 100)); img.Keep != chat.Ephemeral {
		t.Fatal("blindness not remembered across turns")
	}
}

func TestTurnStartRemovesKeptImages(t *testing.T) {
	kept := shot("old", 20000)
	kept.Keep, kept.Cost = chat.Kept, 900
	hist := []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Parts: []chat.Part{chat.Text{Text: "ok"}, kept}}}}}
	for name, c := range map[string]struct {
		turn Turn
		want reason.Code
	}{
		"switch turned off": {Turn{Profile: profile(100000), Thread: chat.Main, Switch: false}, reason.KeyOff},
		"vision absent":     {Turn{Profile: tokens.Profile{ContextWindow: 100000, Vision: false}, Thread: chat.Main, Switch: true}, reason.NoVision},
		"engine blind":      {Turn{Profile: profile(100000), Thread: chat.Main, Switch: true, State: KeepState{EngineBlind: true}}, reason.NoVision},
	} {
		t.Run(name, func(t *testing.T) {
			out, removed := StartTurn(c.turn).Start(hist)
			_, markers := imagesIn(out)
			if len(removed) != 1 || removed[0].Reason != c.want || removed[0].Cost != 900 || len(markers) != 1 || markers[0].Caption != "old" {
				t.Fatalf("removed %+v markers %+v", removed, markers)
			}
			if imgs, _ := imagesIn(hist); len(imgs) != 1 {
				t.Fatal("Start mutated the history")
			}
		})
	}
	out, removed := StartTurn(Turn{Profile: profile(100000), Thread: chat.Main, Switch: true}).Start(hist)
	if len(removed) != 0 || &out[0] != &hist[0] {
		t.Fatal("switch on: turn start must leave the history as it is")
	}
}

// wire is what a request carries: the keep metadata is imgctx's own and
// never reaches the engine.
func wire(msgs []chat.Message) []chat.Message {
	return edit(msgs, func(_ int, p chat.Part, _ int) ([]chat.Part, bool) {
		img, ok := p.(chat.Image)
		if !ok {
			return nil, false
		}
		img.Keep, img.Cost, img.Origin = "", 0, ""
		return []chat.Part{img}, true
	})
}

// Seed: "requête identique avec et sans la clé". Inside a turn every request
// is byte-identical whether the switch is on or off; only the history the
// next turn starts from differs (kept image vs marker).
func TestSwitchChangesNoRequestInsideATurn(t *testing.T) {
	img := shot("login", 15000)
	run := func(on bool) (requests [][]chat.Message, next []chat.Message) {
		f := newFixture(on, 200000, img)
		requests = append(requests, wire(f.turn.Rewritten(f.msgs)))
		f.toolStep(img)
		requests = append(requests, wire(f.turn.Rewritten(f.msgs)))
		f.request(false)
		requests = append(requests, wire(f.turn.Rewritten(f.msgs)))
		next, _, _ = f.finish()
		return requests, next
	}
	onReqs, onNext := run(true)
	offReqs, offNext := run(false)
	if !reflect.DeepEqual(onReqs, offReqs) {
		t.Fatal("the switch changed a request inside the turn")
	}
	onImgs, _ := imagesIn(onNext)
	offImgs, offMarkers := imagesIn(offNext)
	if len(onImgs) != 1 || len(offImgs) != 0 || len(offMarkers) != 1 {
		t.Fatalf("next turn: on keeps %d images, off keeps %d with %d markers", len(onImgs), len(offImgs), len(offMarkers))
	}
}

// Invariant: whatever the sizes, true costs and order, the measured cost
// of kept images never exceeds the budget, and every relayed image ends
// kept or counted as removed with a reason.
func TestKeptCostNeverExceedsBudget(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		window := rapid.IntRange(1000, 100000).Draw(rt, "window")
		n := rapid.IntRange(1, 8).Draw(rt, "images")
		var imgs []chat.Image
		for i := range n {
			img := shot(string(rune('a'+i)), int64(rapid.IntRange(100, 80000).Draw(rt, "bytes")))
			imgs = append(imgs, img)
		}
		f := newFixture(true, window, imgs...)
		for _, img := range imgs {
			f.engine.trueCost[img.Ref] = rapid.IntRange(0, 5000).Draw(rt, "cost")
		}
		budget := int(0.10 * float64(window))
		for len(imgs) > 0 {
			step := rapid.IntRange(1, len(imgs)).Draw(rt, "step")
			f.toolStep(imgs[:step]...)
			imgs = imgs[step:]
			if rapid.Bool().Draw(rt, "request") {
				f.request(rapid.Bool().Draw(rt, "cut"))
			}
		}
		out, removed, _ := f.finish()
		if got := KeptCost(out); got > budget {
			rt.Fatalf("kept %d tokens over a budget of %d", got, budget)
		}
		kept, _ := imagesIn(out)
		if len(kept)+len(removed) != n {
			rt.Fatalf("%d kept + %d removed != %d relayed", len(kept), len(removed), n)
		}
		for _, r := range removed {
			if !r.Reason.Valid() {
				rt.Fatalf("removal without a valid reason: %+v", r)
			}
		}
	})
}

// A turn saved between two calls and resumed (as after a restart) ends
// exactly as the same turn run in one process.
func TestTurnSnapshotResumesExactly(t *testing.T) {
	a, b := shot("a", 15000), shot("b", 9000)
	run := func(pause bool) ([]chat.Message, []Removal, KeepState) {
		f := newFixture(true, 30000, a, b)
		f.toolStep(a)
		f.turn.Sending(f.msgs) // sent, not yet observed
		if pause {
			snap := f.turn.Snapshot()
			f.turn = ResumeTurn(Turn{Profile: profile(30000), Thread: chat.Main, Switch: true, Counter: tokens.Chars4{}, Storer: f.store}, snap)
		}
		u := chat.Usage{Prompt: f.engine.prompt(f.msgs)}
		f.turn.Observe(&u, false)
		f.toolStep(b)
		f.request(false)
		return f.finish()
	}
	m1, r1, s1 := run(false)
	m2, r2, s2 := run(true)
	if !reflect.DeepEqual(m1, m2) || !reflect.DeepEqual(r1, r2) || s1 != s2 {
		t.Fatalf("resumed turn differs:\n%+v\n%+v", r1, r2)
	}
	if KeptCost(m1) != 1500+900 {
		t.Fatalf("kept %d", KeptCost(m1))
	}
}

// Captions come from what the conversation already says: the text beside
// the image (its first line, bounded), else the call the result answers;
// a caption given is kept.
func TestCaptionFromTheConversation(t *testing.T) {
	calls := func(id string) (chat.ToolCall, bool) {
		return chat.ToolCall{ID: id, Name: "screenshot", Arguments: `{"url":"https://example.com/login"}`}, id == "c1"
	}
	shot := func(name string, n int64) chat.Image { img := shot(name, n); img.Caption = ""; return img }
	user := Caption(chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "\n  The checkout page  \nmore"}, shot("a", 1)}}, nil)
	tool := Caption(chat.Message{Role: chat.Tool, Parts: []chat.Part{
		chat.ToolResult{CallID: "c1", Parts: []chat.Part{shot("b", 1)}},
		chat.ToolResult{CallID: "c2", Parts: []chat.Part{chat.Text{Text: strings.Repeat("long ", 40)}, shot("c", 1)}},
		chat.ToolResult{CallID: "c1", Parts: []chat.Part{chat.Image{Caption: "given"}}},
	}}, calls)
	got := []string{
		user.Parts[1].(chat.Image).Caption,
		tool.Parts[0].(chat.ToolResult).Parts[0].(chat.Image).Caption,
		tool.Parts[1].(chat.ToolResult).Parts[1].(chat.Image).Caption,
		tool.Parts[2].(chat.ToolResult).Parts[0].(chat.Image).Caption,
	}
	if got[0] != "The checkout page" || got[1] != `screenshot {"url":"https://example.com/login"}` || len([]rune(got[2])) != 80 || got[3] != "given" {
		t.Fatalf("%q", got)
	}
	if m, _ := chat.MarkerFor(user.Parts[1], "budget"); m.String() != "[image removed — The checkout page]" {
		t.Fatalf("marker %q", m.String())
	}
}

// With images held (Hold, a cache that bills writes) and an image of the
// conversation measured already, a screenshot that goes unmeasured (its
// request's usage did not come back) is kept at its estimated cost: the
// engine was seen to see images, and removing it would break the cached
// prefix for nothing. Without that measurement it is unmeasured, as
// before; the learned fact outlives the turn.
func TestUnmeasuredIsKeptOnceTheEngineWasSeenToSee(t *testing.T) {
	held := profile(200000)
	held.Cache.Breakpoints = 4
	held.Prices = &tokens.Prices{Input: 3, CacheRead: 0.3, CacheWrite: 3.75}
	start := func(state KeepState) (*KeepTurn, []chat.Message) {
		k := StartTurn(Turn{Config: KeepConfig{Hold: true, Sight: DefaultSight}, Profile: held, Thread: chat.Main, Switch: true, State: state, Counter: tokens.Chars4{}, Storer: &storer{}})
		msgs, _ := k.Start([]chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "look"}}}})
		return k, msgs
	}
	unmeasured := func(k *KeepTurn, msgs []chat.Message, img chat.Image) ([]Removal, KeepState, []chat.Image) {
		msgs = append(msgs, chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Parts: []chat.Part{k.Relay(img)}}}})
		k.Sending(msgs)
		k.Observe(nil, false) // no usage: no measurement
		out, removed, st := k.Finish(msgs)
		imgs, _ := imagesIn(out)
		return removed, st, imgs
	}
	k, msgs := start(KeepState{})
	if removed, st, _ := unmeasured(k, msgs, shot("first", 15000)); len(removed) != 1 || removed[0].Reason != reason.Unmeasured || st.Vouched {
		t.Fatalf("nothing measured yet: removed %+v, vouched %v; want unmeasured", removed, st.Vouched)
	}
	k, msgs = start(KeepState{Vouched: true})
	removed, st, imgs := unmeasured(k, msgs, shot("second", 15000))
	if len(removed) != 0 || len(imgs) != 1 || imgs[0].Keep != chat.Kept || imgs[0].Cost != 1000 || !st.Vouched {
		t.Fatalf("vouched: removed %+v, images %+v; want it kept at the profile's 1000 tokens", removed, imgs)
	}
	snap := k.Snapshot()
	if again := ResumeTurn(Turn{Config: KeepConfig{Hold: true, Sight: DefaultSight}, Profile: held, Thread: chat.Main, Switch: true}, snap).Snapshot(); !again.Vouched {
		t.Fatal("a snapshot forgets that the engine sees images")
	}
}

// Past half the cut, the budget stands down where images are priced and
// not held: a removal then only postpones the client's compaction
// (Turn.Postpones). Before half, without prices, without a measured
// prompt or with images held by price, the budget applies as before.
func TestTheBudgetStandsDownPastHalfTheCut(t *testing.T) {
	priced := profile(20000)
	priced.Cache = tokens.CacheRules{Automatic: true}
	priced.Prices = &tokens.Prices{Input: 2.5, CacheRead: 1.25, Output: 10}
	a, b := shot("a", 15000), shot("b", 12000) // true costs 1500 and 1200: the budget of 2000 fits one
	for _, c := range []struct {
		name    string
		profile tokens.Profile
		config  KeepConfig
		base    Base
		kept    int // images kept at the turn's end
	}{
		{"past half the cut, priced", priced, KeepConfig{}, Base{Valid: true, Prompt: 9000, Messages: 2}, 2},
		{"before half the cut", priced, KeepConfig{}, Base{Valid: true, Prompt: 7000, Messages: 2}, 1},
		{"no prices", profile(20000), KeepConfig{}, Base{Valid: true, Prompt: 9000, Messages: 2}, 1},
		{"no measured prompt", priced, KeepConfig{}, Base{}, 1},
		{"held by price", priced, KeepConfig{Hold: true, Sight: 2}, Base{Valid: true, Prompt: 9000, Messages: 2}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(true, 20000, a, b)
			f.turn = StartTurn(Turn{Config: c.config, Profile: c.profile, Thread: chat.Main, Switch: true, Counter: tokens.Chars4{}, Storer: f.store,
				State: KeepState{Base: c.base}, Cut: 16000})
			f.msgs, _ = f.turn.Start(f.msgs)
			f.request(false)
			f.toolStep(a)
			f.request(false)
			f.toolStep(b)
			f.request(false)
			out, removed, _ := f.finish()
			if imgs, _ := imagesIn(out); len(imgs) != c.kept || len(removed) != 2-c.kept {
				t.Fatalf("%d images kept, %d removed; want %d kept", len(imgs), len(removed), c.kept)
			}
		})
	}
}
