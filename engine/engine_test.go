package engine

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// Seed keep-turn-images.md, "La boucle du tour" and "Le vrai hôte", and the
// engine issue's list, case by case:
//
//	image stored by ref, seen inline by the engine, kept at its measured cost  TestKeptAtTheUsageShare
//	request identical with and without the key; prefix stable across turns     TestPrefixStable
//	key removed: the image leaves at the next turn start, caption kept         TestSwitchOffRemovesAtTurnStart
//	refusals: budget / no usage / store refused                                policy tests (keep_test.go)
//	trial image at the end of a turn                                           policy TestFinishTrialNeverMeasured
//	removal at the reactive net, without a summary                             TestPromptTooLongRemovesImagesFirst
//	compaction when images are not enough, input without base64; then error   TestPromptTooLongThenCompactThenError
//	removal mid-turn at the threshold, compaction only if still needed         TestPressureEvictsBeforeSending
//	completion cut by a full window: replay without kept images                TestCutCompletionReplaysWithoutKeptImages
//	  none kept: compact, then replay; OpenAI's "length" far from the window  TestCutCompletionCompactsWhenNoImageIsKept
//	a restarted process resumes identical history, keep states and costs       TestRestartResumesExactly
//	retry on 5xx measured once                                                 TestRetriedRequestIsMeasuredOnce
//	bad input: unknown ref, another tenant's ref, bad base64, wrong turn       TestIngestRefusals

var formats = []upstream.Format{upstream.OpenAI, upstream.Anthropic}

// turn is one screenshot turn: a user asks, the model calls the
// screenshot tool, the client sends the screenshot, the model answers.
func turn(t *testing.T, r *rig, id session.ID, text, shot string) *Result {
	t.Helper()
	res := r.call(t, id, user(text))
	return r.call(t, id, toolResult(t, res, shot))
}

func TestKeptAtTheUsageShare(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."})
			id := r.session(t, true)
			end := turn(t, r, id, "Open the login page.", screenshot(1280, 800, 1))
			if !end.TurnEnd {
				t.Fatal("the turn did not end")
			}
			kept := keptImages(r.live(t, id).Live)
			// The upstream charged the image 46×29 = 1334 tokens (28-px rule);
			// imgctx must have measured exactly that from the usage delta.
			if len(kept) != 1 || kept[0].Cost != r.up.imageTokens[1] || kept[0].Cost != 1334 {
				t.Fatalf("kept %+v; upstream charged %v", kept, r.up.imageTokens)
			}
			if kept[0].Ref.String() == "" || kept[0].URL != "" {
				t.Fatal("the kept image is not held by ref")
			}
			if !hasEvent(r.events, "kept", "") {
				t.Fatal("no kept event")
			}
		})
	}
}

// messagesArray returns the bytes of a request's messages array.
func messagesArray(t *testing.T, body []byte) []byte {
	i := bytes.Index(body, []byte(`"messages":[`))
	if i < 0 {
		t.Fatalf("no messages in %s", body)
	}
	return body[i+len(`"messages":`):]
}

func stripCacheControl(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte(`,"cache_control":{"type":"ephemeral"}`), nil)
}

// With images kept, each request starts with exactly the bytes of the one
// before it (the provider's prompt cache keeps hitting); with the switch
// off, the next turn differs at the image that left. Anthropic breakpoints
// move to the newest message, and the cache_control marks are not content,
// so they are set aside for the comparison.
func TestPrefixStable(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			run := func(keep bool) [][]byte {
				r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."},
					reply{text: "Done."})
				id := r.session(t, keep)
				turn(t, r, id, "Open the login page.", screenshot(640, 400, 2))
				r.call(t, id, user("Thanks. Anything else?"))
				var out [][]byte
				for _, b := range r.up.requests {
					out = append(out, stripCacheControl(messagesArray(t, b)))
				}
				return out
			}
			on := run(true)
			for i := 1; i < len(on); i++ {
				prev := on[i-1][:len(on[i-1])-len("]}")]
				if f == upstream.OpenAI {
					prev = on[i-1][:bytes.LastIndexByte(on[i-1], ']')]
				}
				prev = prev[:bytes.LastIndexByte(prev, '}')+1]
				if !bytes.HasPrefix(on[i], prev) {
					t.Fatalf("keep on: request %d does not start with request %d", i+1, i)
				}
			}
			off := run(false)
			// Inside the turn, requests are the same as with the switch on.
			if !bytes.Equal(off[0], on[0]) || !bytes.Equal(off[1], on[1]) {
				t.Fatal("the switch changed a request inside the turn")
			}
			// The next turn differs, at the image that became a marker.
			n := 0
			for n < len(off[2]) && n < len(on[2]) && off[2][n] == on[2][n] {
				n++
			}
			img := bytes.Index(on[2], []byte(`data:image/png;base64,`))
			if img < 0 {
				img = bytes.Index(on[2], []byte(`"type":"base64"`))
			}
			if n == len(off[2]) || n < img-200 || n > img+40 {
				t.Fatalf("keep off: requests diverge at byte %d; the image is at %d", n, img)
			}
			if !bytes.Contains(off[2], []byte("[image removed — captured]")) {
				t.Fatal("no marker where the image was")
			}
		})
	}
}

func TestSwitchOffRemovesAtTurnStart(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."}, reply{text: "ok"})
	id := r.session(t, true)
	turn(t, r, id, "Open the login page.", screenshot(640, 400, 3))
	if len(keptImages(r.live(t, id).Live)) != 1 {
		t.Fatal("not kept")
	}
	// The client turns the switch off: the next turn starts without it.
	snap, _ := r.engine.Sessions.Load(t.Context(), "acme", id)
	r.engine.Sessions.Delete(t.Context(), "acme", id)
	snap.Meta.Settings.KeepTurnImages = false
	m, _ := r.engine.Sessions.Create(t.Context(), snap.Meta)
	r.engine.Sessions.Append(t.Context(), "acme", m.ID, nil, snap.State)
	r.call(t, m.ID, user("Next question."))
	live := r.live(t, m.ID).Live
	if len(keptImages(live)) != 0 || !hasEvent(r.events, "removed", string(reason.KeyOff)) {
		t.Fatal("the kept image did not leave when the switch went off")
	}
	found := false
	for _, msg := range live {
		chat.Walk(msg.Parts, func(p chat.Part, _ int) bool {
			if mk, ok := p.(chat.Marker); ok && mk.Reason == "key_off" && mk.MediaType == "image/png" {
				found = true
			}
			return true
		})
	}
	if !found {
		t.Fatal("no marker kept its place")
	}
}

// A window too small for the next request with its kept images: the first
// replay drops the kept images and no summary is made.
func TestPromptTooLongRemovesImagesFirst(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."}, reply{text: "Here it is."})
			id := r.session(t, true)
			turn(t, r, id, "Open the login page.", screenshot(1280, 800, 4))
			r.up.overflowAt = r.up.prompts[len(r.up.prompts)-1] + 100 // with the image (1334), the next request no longer fits
			r.call(t, id, user(strings.Repeat("Please describe everything in detail. ", 30)))
			if len(r.up.summaries) != 0 {
				t.Fatal("a summary was made although removing the images was enough")
			}
			if !hasEvent(r.events, "removed", "overflow") || !hasEvent(r.events, "retried", "overflow") {
				t.Fatalf("events %+v", r.events)
			}
			if len(keptImages(r.live(t, id).Live)) != 0 {
				t.Fatal("kept images survived the overflow")
			}
		})
	}
}

// longTurns plays three turns of about 1,000 tokens of text each, each
// with a 600×400 screenshot from the tool (seeds from seed on).
func longTurns(t *testing.T, r *rig, id session.ID, seed uint8) {
	t.Helper()
	for i := range uint8(3) {
		r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: strings.Repeat("Seen. ", 100)})
		turn(t, r, id, strings.Repeat("look ", 800), screenshot(600, 400, seed+i))
	}
}

func TestPromptTooLongThenCompactThenError(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000)
			id := r.session(t, true)
			// Three turns of history, one kept screenshot each.
			longTurns(t, r, id, 10)
			// Now even without its images (3 × 330 tokens) the prompt is too
			// long: compaction must run.
			r.up.overflowAt = r.up.prompts[len(r.up.prompts)-1] - 1500
			r.up.replies = append(r.up.replies, reply{text: "Answer after compaction."})
			res := r.call(t, id, user("And now?"))
			if res.Message.TextContent() != "Answer after compaction." {
				t.Fatalf("reply %+v", res.Message)
			}
			if len(r.up.summaries) != 1 {
				t.Fatalf("%d summaries; want 1", len(r.up.summaries))
			}
			sum := r.up.summaries[0]
			if bytes.Contains(sum, []byte(";base64,")) || bytes.Contains(sum, []byte(`"type":"base64"`)) || bytes.Contains(sum, []byte(`"image_url"`)) {
				t.Fatalf("image bytes reached the summariser: %.300s", sum)
			}
			snap, _ := r.engine.Sessions.Load(t.Context(), "acme", id)
			var records int
			for _, e := range snap.Log {
				if e.Compaction != nil {
					records++
				}
			}
			if records != 1 || !hasEvent(r.events, "compacted", "") {
				t.Fatalf("%d compaction records", records)
			}
			// The persisted log still holds every original message.
			if len(snap.Log) < 3*4 {
				t.Fatalf("log has %d entries: originals lost", len(snap.Log))
			}
			// A window too small for anything: a clear error, nothing stored.
			r.up.overflowAt = 5
			before, _ := r.engine.Sessions.Load(t.Context(), "acme", id)
			_, err := r.engine.Call(t.Context(), "acme", id, user("Still there?"))
			if !errors.Is(err, ErrContextFull) {
				t.Fatalf("got %v; want ErrContextFull", err)
			}
			after, _ := r.engine.Sessions.Load(t.Context(), "acme", id)
			if !reflect.DeepEqual(before, after) {
				t.Fatal("a failed call changed the session")
			}
		})
	}
}

// Before a request, an estimate past the threshold makes kept images leave
// first, in one batch; compaction does not run when that is enough.
func TestPressureEvictsBeforeSending(t *testing.T) {
	const window = 30000 // keep budget 3000: room for two 1334-token screenshots
	r := newRig(t, upstream.OpenAI, window)
	id := r.session(t, true)
	for i := range 2 {
		r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: "ok"})
		turn(t, r, id, "look", screenshot(1280, 800, uint8(20+i)))
	}
	if n := len(keptImages(r.live(t, id).Live)); n != 2 {
		t.Fatalf("%d kept", n)
	}
	last := r.up.prompts[len(r.up.prompts)-1]
	threshold := last + 300
	r.engine.CompactThreshold = float64(threshold) / window
	r.up.replies = append(r.up.replies, reply{text: "fine"})
	r.call(t, id, user(strings.Repeat("words ", 350))) // ≈525 tokens: over the threshold
	if len(r.up.summaries) != 0 {
		t.Fatal("compaction ran although removing images was enough")
	}
	// Down to the low-water mark (10% under the threshold): the oldest
	// image leaves, the newer one stays, in one batch.
	kept := keptImages(r.live(t, id).Live)
	if len(kept) != 1 || !hasEvent(r.events, "removed", "window") {
		t.Fatalf("%d kept after pressure; events %+v", len(kept), r.events)
	}
	if sent := r.up.prompts[len(r.up.prompts)-1]; sent > threshold {
		t.Fatalf("the request carried %d tokens, over the threshold %d", sent, threshold)
	}
}

func TestCutCompletionReplaysWithoutKeptImages(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."},
		reply{text: "The", windowFull: true}, reply{text: "The full answer."})
	id := r.session(t, true)
	turn(t, r, id, "Open the login page.", screenshot(1280, 800, 5))
	res := r.call(t, id, user("Describe it."))
	if res.Message.TextContent() != "The full answer." || len(r.up.summaries) != 0 {
		t.Fatalf("reply %q, %d summaries", res.Message.TextContent(), len(r.up.summaries))
	}
	if !hasEvent(r.events, "retried", "overflow") || len(keptImages(r.live(t, id).Live)) != 0 {
		t.Fatal("the cut completion was not replayed without kept images")
	}
	if r.up.imageTokens[len(r.up.imageTokens)-1] != 0 {
		t.Fatal("the replay still carried the image")
	}
}

// A completion cut by a full window with no kept image to take out
// (keeping off): the history is compacted, without its images' bytes, and
// the request replayed once; the client gets the replay's answer. On
// OpenAI's wire "length" says the window is full only when the usage
// reaches it: far from it, the cut is the client's max_tokens, and the
// answer goes back as it came.
func TestCutCompletionCompactsWhenNoImageIsKept(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000)
			id := r.session(t, false)
			longTurns(t, r, id, 20)
			if n := len(keptImages(r.live(t, id).Live)); n != 0 {
				t.Fatalf("%d kept images with keeping off", n)
			}
			r.up.replies = append(r.up.replies, reply{text: "The", windowFull: true}, reply{text: "The full answer."})
			res := r.call(t, id, user("Describe it all."))
			if f == upstream.OpenAI {
				if res.Message.TextContent() != "The" || hasEvent(r.events, "retried", "") || len(r.up.summaries) != 0 {
					t.Fatalf("a cut far from the window was replayed: reply %q, %d summaries", res.Message.TextContent(), len(r.up.summaries))
				}
				return
			}
			if res.Message.TextContent() != "The full answer." {
				t.Fatalf("reply %q", res.Message.TextContent())
			}
			if !hasEvent(r.events, "retried", "compaction") || len(r.up.summaries) != 1 {
				t.Fatalf("%d summaries; events %+v", len(r.up.summaries), r.events)
			}
			if sum := r.up.summaries[0]; bytes.Contains(sum, []byte(`"type":"base64"`)) {
				t.Fatalf("image bytes reached the summariser: %.300s", sum)
			}
			if last, first := r.up.prompts[len(r.up.prompts)-1], r.up.prompts[len(r.up.prompts)-2]; last >= first {
				t.Fatalf("the replay carried %d tokens, the cut request %d: nothing was compacted", last, first)
			}
		})
	}
}

// Kill the engine between two calls: a new process on the same data
// directory resumes with identical history, keep states and costs, mid-turn.
func TestRestartResumesExactly(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."},
		reply{toolCall: "screenshot"}, reply{text: "Now logged in."})
	id := r.session(t, true)
	turn(t, r, id, "Open the login page.", screenshot(1280, 800, 6))
	open := r.call(t, id, user("Log in and show me.")) // the turn is open: a tool call
	before, _ := r.engine.Sessions.Load(t.Context(), "acme", id)

	r.engine = r.open(t) // a new process on the same directory
	after, err := r.engine.Sessions.Load(t.Context(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatal("the session differs after a restart")
	}
	if !after.State.TurnOpen || after.State.Turn == nil || len(keptImages(after.State.Live)) != 1 {
		t.Fatalf("state after restart: open %v turn %v", after.State.TurnOpen, after.State.Turn)
	}
	res := r.call(t, id, toolResult(t, open, screenshot(1280, 800, 7)))
	if !res.TurnEnd {
		t.Fatal("the resumed turn did not finish")
	}
	kept := keptImages(r.live(t, id).Live)
	if len(kept) != 2 || kept[0].Cost != 1334 || kept[1].Cost != 1334 {
		t.Fatalf("after the resumed turn: %+v", kept)
	}
}

func TestRetriedRequestIsMeasuredOnce(t *testing.T) {
	r := newRig(t, upstream.OpenAI, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."})
	id := r.session(t, true)
	res := r.call(t, id, user("Open the login page."))
	r.up.failNext = 2 // two 503s before the request goes through
	r.call(t, id, toolResult(t, res, screenshot(1280, 800, 8)))
	kept := keptImages(r.live(t, id).Live)
	if len(kept) != 1 || kept[0].Cost != 1334 {
		t.Fatalf("kept %+v", kept)
	}
}

func TestIngestRefusals(t *testing.T) {
	r := newRig(t, upstream.OpenAI, 100000, reply{text: "ok"})
	id := r.session(t, true)
	img := func(url string) []chat.Message {
		return []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "see"}, chat.Image{URL: url}}}}
	}
	cases := map[string]struct {
		msgs []chat.Message
		want reason.Code
		err  error
	}{
		"bad base64":   {img("data:image/png;base64,@@@@"), reason.Invalid, nil},
		"unknown type": {img("data:image/png;base64,aGVsbG8gd29ybGQ="), reason.Invalid, nil},
		"unknown ref":  {img("imgctx:sha256-" + strings.Repeat("ab", 32)), "", ErrUnknownRef},
		"no fetcher":   {img("https://example.com/a.png"), reason.FetchFailed, nil},
		"tool first":   {[]chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "x"}}}}, "", ErrBadTurn},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := r.engine.Call(t.Context(), "acme", id, c.msgs)
			if c.err != nil && !errors.Is(err, c.err) || c.want != "" && reason.Of(err) != c.want {
				t.Fatalf("got %v", err)
			}
		})
	}
	// A ref stored by another tenant answers like a missing one.
	other, _ := r.engine.NewSession(t.Context(), "globex", chat.Settings{Model: "scripted-vl", KeepTurnImages: true}, chat.Main)
	shot := screenshot(64, 64, 9)
	r.up.replies = append(r.up.replies, reply{text: "ok"})
	if _, err := r.engine.Call(t.Context(), "globex", other.ID, img(shot)); err != nil {
		t.Fatal(err)
	}
	ref := keptOrAny(r.live2(t, "globex", other.ID))
	if _, err := r.engine.Call(t.Context(), "acme", id, img("imgctx:"+ref)); !errors.Is(err, ErrUnknownRef) {
		t.Fatalf("another tenant's ref: %v", err)
	}
	if snap, _ := r.engine.Sessions.Load(t.Context(), "acme", id); len(snap.Log) != 0 {
		t.Fatal("a refused call left entries")
	}
}

func (r *rig) live2(t *testing.T, tenant string, id session.ID) []chat.Message {
	snap, err := r.engine.Sessions.Load(t.Context(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return snap.State.Live
}

func keptOrAny(msgs []chat.Message) string {
	for _, m := range msgs {
		for _, im := range m.Images() {
			return im.Ref.String()
		}
	}
	return ""
}

// A session idle past the threshold is microcompacted at its next turn:
// the old screenshots inside tool results are cleared, the text stays.
func TestIdleSessionIsMicrocompacted(t *testing.T) {
	r := newRig(t, upstream.OpenAI, 100000)
	now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	r.engine.Now = func() time.Time { return now }
	id := r.session(t, true)
	for i := range 3 {
		r.up.replies = append(r.up.replies, reply{toolCall: "mcp_screenshot"}, reply{text: "ok"})
		turn(t, r, id, "look", screenshot(200, 200, uint8(30+i)))
	}
	now = now.Add(2 * time.Hour)
	r.up.replies = append(r.up.replies, reply{text: "back"})
	r.call(t, id, user("I'm back."))
	if !hasEvent(r.events, "compacted", "microcompaction") || compactions(r.events) != CompactedMicro || !hasEvent(r.events, "removed", "idle") {
		t.Fatalf("events %+v", r.events)
	}
	// keep_recent 1: one screenshot result keeps its image.
	if n := len(keptImages(r.live(t, id).Live)); n != 1 {
		t.Fatalf("%d kept images after microcompaction; want 1", n)
	}
}

// Provider rules apply on the way out: a profile allowing one image per
// request turns the older one into a marker with provider_limit.
func TestProviderRulesOnEveryRequest(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{text: "two images seen"})
	p := r.up.profile
	p.Limits.MaxImages = 1
	r.engine.Profiles, _ = r.engine.Profiles.With(p)
	id := r.session(t, true)
	r.call(t, id, []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "compare"},
		chat.Image{URL: screenshot(100, 100, 40)}, chat.Image{URL: screenshot(100, 100, 41)}}}})
	if r.up.imageTokens[0] != 16 || !hasEvent(r.events, "removed", "provider_limit") {
		t.Fatalf("upstream priced %d image tokens; events %+v", r.up.imageTokens[0], r.events)
	}
}

// On the sessions path too, an image over the provider's edge goes shrunk
// (with a shrinker), with the resize note beside it, and the turn says
// so: a shrunk event naming the rule. The live context keeps the shrunk
// copy and its note, so the next turn sends the same bytes.
func TestProviderRulesShrinkOnTheSessionsPath(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{text: "seen"}, reply{text: "again"})
	p := r.up.profile
	p.Limits.MaxEdge = 400
	r.engine.Profiles, _ = r.engine.Profiles.With(p)
	r.engine.Shrinker = &media.Shrinker{}
	id := r.session(t, true)
	r.call(t, id, []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "click the button"}, chat.Image{URL: screenshot(1280, 800, 50)}}}})
	var shrunk *Event
	for i, e := range r.events {
		if e.Kind == "shrunk" {
			shrunk = &r.events[i]
		}
	}
	if shrunk == nil || shrunk.Reason != "provider_limit" || shrunk.Detail == "" || shrunk.Ref == (blob.Ref{}) {
		t.Fatalf("no shrunk event with its reason, rule and ref: %+v", r.events)
	}
	first := r.up.requests[0]
	note := policy.ResizeNote(1280, 800, 400, 250)
	if !bytes.Contains(first, []byte(note)) {
		t.Fatalf("no resize note in the request: %.300s", first)
	}
	data := regexp.MustCompile(`"data":"([^"]+)"`).FindSubmatch(first)
	if data == nil {
		t.Fatal("no image in the request")
	}
	raw, _ := base64.StdEncoding.DecodeString(string(data[1]))
	if in, err := media.Inspect(raw, "", media.Limits{}); err != nil || in.Width != 400 || in.Height != 250 || in.Ref != shrunk.Ref {
		t.Fatalf("the image sent is %dx%d %s (%v); want the shrunk copy, 400x250 %s", in.Width, in.Height, in.Ref, err, shrunk.Ref)
	}
	r.call(t, id, user("And again?"))
	second := r.up.requests[1]
	if !bytes.HasPrefix(second, first[:bytes.Index(first, []byte(note))+len(note)]) {
		t.Fatal("the next turn does not send the shrunk image and its note as the first did")
	}
}

// Anthropic requests put breakpoints on the system prompt, on the turn
// holding the newest kept image, and on the newest message.
func TestAnthropicBreakpoints(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{text: "ok"}, reply{text: "fine"})
	id := r.session(t, true)
	r.call(t, id, []chat.Message{{Role: chat.System, Parts: []chat.Part{chat.Text{Text: "You drive a browser."}}}, user("Open the page.")[0]})
	res := r.up.requests[0]
	if !bytes.Contains(res, []byte(`"system":[{"type":"text","text":"You drive a browser.","cache_control":{"type":"ephemeral"}}]`)) {
		t.Fatalf("no breakpoint on the system prompt: %s", res)
	}
	r.call(t, id, toolResult(t, &Result{Message: lastReply(t, r, id)}, screenshot(640, 400, 42)))
	r.call(t, id, user("And now?"))
	final := string(r.up.requests[len(r.up.requests)-1])
	if n := strings.Count(final, "cache_control"); n != 3 {
		t.Fatalf("%d breakpoints; want 3 (system, kept image, newest)", n)
	}
	img := strings.Index(final, `"type":"image"`)
	bp := strings.Index(final[img:], "cache_control")
	next := strings.Index(final[img:], `"role":"assistant"`)
	if img < 0 || bp < 0 || bp > next {
		t.Fatal("no breakpoint in the turn holding the kept image")
	}
}

func lastReply(t *testing.T, r *rig, id session.ID) chat.Message {
	live := r.live(t, id).Live
	return live[len(live)-1]
}

// An upstream known to be text-only never keeps images, whatever the
// profile says.
func TestHintsOverrideTheProfile(t *testing.T) {
	r := newRig(t, upstream.OpenAI, 100000, reply{toolCall: "screenshot"}, reply{text: "ok"})
	no := false
	r.engine.Hints = Hints{Vision: &no, ContextWindow: 50000}
	if p := r.engine.Profile("scripted-vl"); p.Vision || p.ContextWindow != 50000 {
		t.Fatalf("profile %+v", p)
	}
	id := r.session(t, true)
	turn(t, r, id, "look", screenshot(300, 300, 43))
	if len(keptImages(r.live(t, id).Live)) != 0 || !hasEvent(r.events, "removed", "no_vision") {
		t.Fatalf("events %+v", r.events)
	}
}

// Within a turn the Anthropic requests are byte-identical with the switch
// on or off, cache breakpoints included: an image kept mid-turn does not
// move a breakpoint until the next turn.
func TestSwitchChangesNoBreakpointInsideATurn(t *testing.T) {
	run := func(keep bool) [][]byte {
		r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{toolCall: "screenshot"}, reply{text: "Done."})
		id := r.session(t, keep)
		res := r.call(t, id, user("Open the login page."))
		res = r.call(t, id, toolResult(t, res, screenshot(640, 400, 3)))
		r.call(t, id, toolResult(t, res, screenshot(640, 400, 4)))
		return r.up.requests
	}
	on, off := run(true), run(false)
	for i := range on {
		if !bytes.Equal(on[i], off[i]) {
			t.Fatalf("request %d of the turn differs with the switch on and off:\n on %s\noff %s", i+1, on[i], off[i])
		}
	}
}

// fullStore is an image store whose disk is full: it refuses every write.
type fullStore struct{ imagestore.Store }

func (fullStore) Put(context.Context, string, blob.Ref, []byte) error {
	return errors.New("no space left on device")
}

// Seed keep-turn-images, "rangement refusé": a tool image the store
// refuses is no error. It is sent inline through its turn, ephemeral,
// keeping stops for the rest of the turn, and the next turn has its
// marker (reason refused).
func TestStoreRefusalAtRelayLeavesTheImageEphemeral(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{toolCall: "screenshot"}, reply{text: "Done."}, reply{text: "ok"})
			r.engine.Images = fullStore{r.engine.Images}
			id := r.session(t, true)
			res := r.call(t, id, user("Open the login page."))
			shot := screenshot(640, 400, 9)
			res = r.call(t, id, toolResult(t, res, shot))
			r.call(t, id, toolResult(t, res, screenshot(640, 400, 10)))
			b64 := shot[strings.Index(shot, ",")+1:]
			if !bytes.Contains(r.up.requests[1], []byte(b64[:400])) || !bytes.Contains(r.up.requests[2], []byte(b64[:400])) {
				t.Fatal("the refused image was not sent through its turn")
			}
			if !hasEvent(r.events, "refused", "refused") {
				t.Fatal("no refused event")
			}
			r.call(t, id, user("And now?"))
			last := r.up.requests[len(r.up.requests)-1]
			if bytes.Contains(last, []byte(b64[:400])) || bytes.Count(last, []byte("(refused)]")) != 2 {
				t.Fatalf("the next turn: %d refused markers", bytes.Count(last, []byte("(refused)]")))
			}
		})
	}
}

// A tool result must answer a call the last reply made.
func TestToolResultForACallNotMadeIsRefused(t *testing.T) {
	r := newRig(t, upstream.OpenAI, 100000, reply{toolCall: "screenshot"}, reply{text: "Done."})
	id := r.session(t, true)
	r.call(t, id, user("Open the login page."))
	stray := []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "call_nobody_made", Parts: []chat.Part{chat.Text{Text: "?"}}}}}}
	if _, err := r.engine.Call(t.Context(), "acme", id, stray); !errors.Is(err, ErrBadTurn) {
		t.Fatalf("a result for a call not made: %v", err)
	}
	if n := len(r.up.requests); n != 1 {
		t.Fatalf("%d upstream requests; the stray result must not be sent", n)
	}
}

// When the summariser's own request is too long, the client is told that
// the context is full — not handed the summariser's upstream error as if
// its own request had been refused.
func TestSummarisersOverflowIsNotTheRequestsError(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000)
			id := r.session(t, false)
			for range 3 {
				r.up.replies = append(r.up.replies, reply{text: strings.Repeat("Seen. ", 100)})
				r.call(t, id, user(strings.Repeat("look ", 800)))
			}
			r.up.overflowAt = 100
			r.up.summaryOverflow = true
			_, err := r.engine.Call(t.Context(), "acme", id, user("And now?"))
			var we *wire.Error
			if !errors.Is(err, ErrContextFull) || errors.As(err, &we) || !strings.Contains(err.Error(), "summary request") {
				t.Fatalf("got %v; want ErrContextFull naming the summary request", err)
			}
			if len(r.up.summaries) != 1 {
				t.Fatalf("%d summary requests", len(r.up.summaries))
			}
		})
	}
}

// A long tool loop under one instruction can be compacted: on
// prompt-too-long with no kept image to drop, the engine summarises the
// older tool rounds and the replay succeeds, every call still next to its
// result.
func TestLongToolLoopCompactsInsideTheTurn(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000)
			id := r.session(t, false)
			r.up.replies = append(r.up.replies, reply{toolCall: "computer"})
			res := r.call(t, id, user("Book a table for two on Friday."))
			for range 30 {
				r.up.replies = append(r.up.replies, reply{toolCall: "computer"})
				var callID string
				for _, p := range res.Message.Parts {
					if tc, ok := p.(chat.ToolCall); ok {
						callID = tc.ID
					}
				}
				res = r.call(t, id, []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: callID, Name: "computer",
					Parts: []chat.Part{chat.Text{Text: strings.Repeat("pixel row ", 400)}}}}}})
			}
			r.up.overflowAt = r.up.prompts[len(r.up.prompts)-1] - 2000
			r.up.replies = append(r.up.replies, reply{text: "Booked."})
			var callID string
			for _, p := range res.Message.Parts {
				if tc, ok := p.(chat.ToolCall); ok {
					callID = tc.ID
				}
			}
			res = r.call(t, id, []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: callID, Name: "computer",
				Parts: []chat.Part{chat.Text{Text: "done"}}}}}})
			if res.Message.TextContent() != "Booked." || len(r.up.summaries) != 1 {
				t.Fatalf("reply %q after %d summaries", res.Message.TextContent(), len(r.up.summaries))
			}
			live := r.live(t, id).Live
			calls := map[string]bool{}
			for _, m := range live {
				for _, p := range m.Parts {
					switch p := p.(type) {
					case chat.ToolCall:
						calls[p.ID] = true
					case chat.ToolResult:
						if !calls[p.CallID] {
							t.Fatalf("a result in the live context answers a summarised call %s", p.CallID)
						}
					}
				}
			}
		})
	}
}

// A tool result takes its name from the call it answers (neither wire
// carries it), so microcompaction's tool list fires on results sent
// without one; with microcompaction off nothing is cleared.
func TestToolResultsAreNamedAfterTheirCall(t *testing.T) {
	for _, off := range []bool{false, true} {
		r := newRig(t, upstream.OpenAI, 100000)
		now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
		r.engine.Now = func() time.Time { return now }
		r.engine.Micro = policy.DefaultMicro()
		r.engine.Micro.KeepRecent.Tool = 0
		r.engine.Micro.Off = off
		id := r.session(t, false)
		r.up.replies = append(r.up.replies, reply{toolCall: "read_file"}, reply{text: "ok"}, reply{text: "back"})
		res := r.call(t, id, user("Read the file."))
		var callID string
		for _, p := range res.Message.Parts {
			if tc, ok := p.(chat.ToolCall); ok {
				callID = tc.ID
			}
		}
		r.call(t, id, []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: callID,
			Parts: []chat.Part{chat.Text{Text: "the whole file"}}}}}})
		now = now.Add(2 * time.Hour)
		r.call(t, id, user("I'm back."))
		last := string(r.up.requests[len(r.up.requests)-1])
		if cleared := strings.Contains(last, policy.ToolSentinel); cleared == off || strings.Contains(last, "the whole file") != off {
			t.Fatalf("off=%v: cleared %v", off, cleared)
		}
	}
}

// Cache-sharing compaction: with the cache warm (the last request within
// the TTL) the summary is asked on the live context as it was sent, so
// the summary request begins with the previous request's bytes (the
// provider reads that prefix from cache, images included); with the clock
// past the TTL the slimmed side query runs, and no base64 reaches it.
func TestCompactionSharesTheCacheWhenWarm(t *testing.T) {
	for _, f := range formats {
		for _, warm := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/warm=%v", f, warm), func(t *testing.T) {
				r := newRig(t, f, 100000)
				now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
				r.engine.Now = func() time.Time { return now }
				r.engine.Micro = policy.MicroConfig{Off: true}
				id := r.session(t, false)
				shot := screenshot(640, 400, 7)
				r.up.replies = append(r.up.replies, reply{text: "Seen."})
				r.call(t, id, []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "Remember this screen."}, chat.Image{URL: shot}}}})
				for range 4 {
					r.up.replies = append(r.up.replies, reply{text: strings.Repeat("Noted. ", 200)})
					r.call(t, id, user(strings.Repeat("log line ", 4000)))
				}
				prev := r.up.requests[len(r.up.requests)-1]
				if !warm {
					now = now.Add(10 * time.Minute)
				}
				r.engine.CompactThreshold = 0.3
				r.up.replies = append(r.up.replies, reply{text: "Done."})
				r.call(t, id, user("And now?"))
				if len(r.up.summaries) != 1 {
					t.Fatalf("%d summary requests", len(r.up.summaries))
				}
				sum := r.up.summaries[0]
				b64 := shot[strings.Index(shot, ",")+1:]
				if warm {
					p, s := stripCacheControl(messagesArray(t, prev)), stripCacheControl(messagesArray(t, sum))
					p = p[:bytes.LastIndexByte(p, ']')] // every message of the previous request, then more
					if !bytes.HasPrefix(s, p) || !hasEvent(r.events, "compacted", "cache-sharing") || compactions(r.events) != CompactedShared {
						t.Fatal("the warm summary request does not begin with the previous request")
					}
					return
				}
				if bytes.Contains(sum, []byte(b64[:200])) || !hasEvent(r.events, "compacted", "slimmed") || compactions(r.events) != CompactedSummary {
					t.Fatal("the cold path is not the slimmed side query")
				}
			})
		}
	}
}
