package engine

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"pgregory.net/rapid"
)

// A handle is a pure function of its conversation and image, has the
// shape ValidHandle accepts, and differs between conversations and
// between images.
func TestRecallHandleIsStableScopedAndWellFormed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		conv := rapid.StringN(1, 64, -1).Draw(t, "conv")
		other := rapid.StringN(1, 64, -1).Filter(func(s string) bool { return s != conv }).Draw(t, "other")
		a := blob.Of(rapid.SliceOfN(rapid.Byte(), 1, 64).Draw(t, "a"))
		b := blob.Of(rapid.SliceOfN(rapid.Byte(), 1, 64).Draw(t, "b"))
		h := RecallHandle(conv, a)
		if h != RecallHandle(conv, a) || !ValidHandle(h) {
			t.Fatalf("handle %q: unstable or malformed", h)
		}
		if RecallHandle(other, a) == h {
			t.Fatalf("two conversations share handle %q", h)
		}
		if a != b && RecallHandle(conv, b) == h {
			t.Fatalf("two images share handle %q", h)
		}
	})
	for _, bad := range []string{"", "i", "iAAAAAAAAAAA", "i0aaaaaaaaaa", "jaaaaaaaaaaa", "iaaaaaaaaaaaa", "iaaaaaaaaaa "} {
		if ValidHandle(bad) {
			t.Errorf("%q passes as a handle", bad)
		}
	}
}

// recallEngine holds one recallable image of w×h for tenant alpha, removed
// from a conversation with model.
func recallEngine(t testing.TB, w, h int, model string) (*Engine, string, []byte) {
	png, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(screenshot(w, h, 1), "data:image/png;base64,"))
	if err != nil {
		t.Fatal(err)
	}
	ref := blob.Of(png)
	images := &imagestore.Mem{}
	if err := images.Put(context.Background(), "alpha", ref, png); err != nil {
		t.Fatal(err)
	}
	sessions := &session.Mem{}
	handle := RecallHandle("conv", ref)
	if err := sessions.SaveRecalls(context.Background(), "alpha", []session.Recall{{Handle: handle, Conversation: "conv", Ref: ref,
		MediaType: "image/png", Reason: "budget", Model: model, Removed: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	return &Engine{Images: images, Sessions: sessions, Profiles: tokens.Default(), Shrinker: &media.Shrinker{}}, handle, png
}

// A handle from a tool call is untrusted: anything but a stored handle of
// the tenant is ErrUnknownHandle, and nothing panics.
func FuzzRecall(f *testing.F) {
	e, h, _ := recallEngine(f, 64, 48, "gpt-4o")
	for _, s := range []string{h, "", "iaaaaaaaaaaa", " " + h + " ", h[:5], "../../x", "i\x00aaaaaaaaaa", h + h} {
		f.Add("alpha", s)
	}
	f.Add("beta", h)
	f.Fuzz(func(t *testing.T, tenant, s string) {
		r, err := e.Recall(context.Background(), tenant, s)
		if err == nil {
			if tenant != "alpha" || r.Handle != h || len(r.Data) == 0 {
				t.Fatalf("recall(%q, %q) answered %+v", tenant, s, r.Recall)
			}
			return
		}
		if !errors.Is(err, ErrUnknownHandle) {
			t.Fatalf("recall(%q, %q): %v; want ErrUnknownHandle", tenant, s, err)
		}
	})
}

// The recalled image is the stored one when the model takes it as it is.
func TestRecallAnswersTheStoredImage(t *testing.T) {
	e, h, png := recallEngine(t, 64, 48, "gpt-4o")
	r, err := e.Recall(context.Background(), "alpha", h)
	if err != nil || string(r.Data) != string(png) || r.MediaType != "image/png" || r.Shrunk {
		t.Fatalf("recall: %v %+v", err, r.Recall)
	}
	list, err := e.Recalls(context.Background(), "alpha", h)
	if err != nil || len(list) != 1 || list[0].Handle != h {
		t.Fatalf("list: %v %+v", err, list)
	}
	if _, err := e.Recalls(context.Background(), "beta", h); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("another tenant listed: %v", err)
	}
}

// A handle whose image the store has since collected is a clear
// ErrUnknownHandle saying so, not a store error nor an empty image.
func TestRecallOfACollectedImage(t *testing.T) {
	e, h, png := recallEngine(t, 64, 48, "gpt-4o")
	in, err := media.Inspect(png, "", media.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Images.Delete(context.Background(), "alpha", in.Ref); err != nil {
		t.Fatal(err)
	}
	_, err = e.Recall(context.Background(), "alpha", h)
	if !errors.Is(err, ErrUnknownHandle) || !strings.Contains(err.Error(), "no longer holds its image") {
		t.Fatalf("recall of a collected image: %v", err)
	}
}

// An image the conversation's model would refuse as stored comes back
// shrunk to its rules: Claude takes no edge over 8,000 pixels.
func TestRecallShrinksToTheModelsRules(t *testing.T) {
	e, h, png := recallEngine(t, 8400, 40, "claude-sonnet-4-6")
	r, err := e.Recall(context.Background(), "alpha", h)
	if err != nil || !r.Shrunk || string(r.Data) == string(png) {
		t.Fatalf("recall: %v, shrunk %v", err, r.Shrunk)
	}
	in, err := media.Inspect(r.Data, "", media.Limits{})
	if err != nil || in.Width > 8000 || in.Width < 7000 {
		t.Fatalf("the recalled image is %d×%d (%v)", in.Width, in.Height, err)
	}
}

// A session with recall offers the model the tool, names each marker's
// handle, and answers the model's call itself: the turn completes with one
// client request, the events show the call, the recalled image goes to the
// model in a tool result and, keeping off, leaves again at the next turn
// under the same handle. A handle of another session, or none, is a tool
// error the model reads.
func TestSessionRecallsNatively(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."},
				reply{recall: true}, reply{text: "It was the login form."})
			m, err := r.engine.NewSession(t.Context(), "acme", chat.Settings{Model: "scripted-vl", Recall: true}, chat.Main)
			if err != nil {
				t.Fatal(err)
			}
			turn(t, r, m.ID, "Open the login page.", screenshot(1280, 800, 1))
			before := len(r.up.requests)
			res := r.call(t, m.ID, user("What did the page show?"))
			if len(r.up.requests)-before != 2 || !res.TurnEnd || res.Message.TextContent() != "It was the login form." {
				t.Fatalf("%d upstream requests for one client call; reply %q, turn end %v", len(r.up.requests)-before, res.Message.TextContent(), res.TurnEnd)
			}
			asked, answered := r.up.requests[before], r.up.requests[before+1]
			h := recallHandleIn.FindSubmatch(asked)
			if h == nil || !bytes.Contains(asked, []byte(`"`+chat.RecallTool+`"`)) || r.up.imageTokens[before] != 0 {
				t.Fatalf("the request before the call: handle %q, tool offered %v, image tokens %d", h, bytes.Contains(asked, []byte(chat.RecallTool)), r.up.imageTokens[before])
			}
			handle := string(h[1])
			// The tool's answer carries the image, after the call naming it.
			if r.up.imageTokens[before+1] == 0 || !bytes.Contains(answered, []byte(`{\"handle\":\"`+handle+`\"}`)) && !bytes.Contains(answered, []byte(`{"handle":"`+handle+`"}`)) {
				t.Fatalf("the recalled image did not reach the model in the tool's answer (%d image tokens)", r.up.imageTokens[before+1])
			}
			if billed := r.up.prompts[before] + r.up.prompts[before+1]; res.Usage == nil || res.Usage.Prompt != billed {
				t.Fatalf("usage %+v; want the two requests' %d prompt tokens", res.Usage, billed)
			}
			if !hasEvent(res.Events, "recalled", handle) {
				t.Fatalf("events %+v; want recalled %s", res.Events, handle)
			}
			live := r.live(t, m.ID).Live
			tm := live[len(live)-2]
			tr, ok := tm.Parts[0].(chat.ToolResult)
			if tm.Role != chat.Tool || !ok || tr.IsError || len(tr.Parts) != 2 {
				t.Fatalf("the tool message the engine answered: %+v", tm)
			}
			// Keeping is off: at the turn's end the recalled image left by
			// the rule any tool image of the turn follows.
			if mk, ok := tr.Parts[1].(chat.Marker); !ok || mk.Reason != "key_off" || RecallHandle(sessionConversation("acme", m.ID), mk.Ref) != handle {
				t.Fatalf("the recalled image after its turn: %+v", tr.Parts[1])
			}

			// The next turn: a marker again, with the same handle.
			r.up.replies = append(r.up.replies, reply{text: "ok"})
			r.call(t, m.ID, user("Thanks."))
			last := r.up.requests[len(r.up.requests)-1]
			if r.up.imageTokens[len(r.up.imageTokens)-1] != 0 || len(recallHandleIn.FindAllSubmatch(last, -1)) != 2 ||
				string(recallHandleIn.FindSubmatch(last)[1]) != handle {
				t.Fatalf("next turn: %d image tokens, handles %q", r.up.imageTokens[len(r.up.imageTokens)-1], recallHandleIn.FindAllSubmatch(last, -1))
			}

			// Another session's handle for the same image is unknown here.
			other, _ := r.engine.NewSession(t.Context(), "acme", chat.Settings{Model: "scripted-vl", Recall: true}, chat.Main)
			r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: "A login form."})
			turn(t, r, other.ID, "Open the login page.", screenshot(1280, 800, 1))
			r.up.replies = append(r.up.replies, reply{text: "ok"})
			r.call(t, other.ID, user("Go on."))
			theirs := string(recallHandleIn.FindSubmatch(r.up.requests[len(r.up.requests)-1])[1])
			if theirs == handle {
				t.Fatal("two sessions share a handle")
			}
			for _, bad := range []string{theirs, "iaaaaaaaaaaa", "../x"} {
				r.up.replies = append(r.up.replies, reply{recall: true, recallHandle: bad}, reply{text: "I cannot see it."})
				res := r.call(t, m.ID, user("And the other one?"))
				live := r.live(t, m.ID).Live
				tr := live[len(live)-2].Parts[0].(chat.ToolResult)
				if !res.TurnEnd || !tr.IsError || !strings.Contains(tr.Parts[0].(chat.Text).Text, "not a handle of this conversation") || !hasEvent(res.Events, "recalled", "unknown handle") {
					t.Fatalf("recall(%q): %+v", bad, tr)
				}
			}
		})
	}
}

// Without recall a session offers no tool and its markers say nothing of
// one.
func TestSessionWithoutRecallOffersNoTool(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."}, reply{text: "ok"})
	id := r.session(t, false)
	turn(t, r, id, "Open the login page.", screenshot(1280, 800, 1))
	r.call(t, id, user("Go on."))
	last := r.up.requests[len(r.up.requests)-1]
	if bytes.Contains(last, []byte(chat.RecallTool)) || bytes.Contains(last, []byte(`"tools"`)) || !bytes.Contains(last, []byte("[image removed")) {
		t.Fatalf("without recall: %s", last)
	}
}

// A reply calling the recall tool and a tool of the client's: imgctx
// answers its own call, the client the other (a result for imgctx's call
// is refused, it is answered already), and the model then reads both
// answers in one turn.
func TestSessionRecallBesideAClientTool(t *testing.T) {
	for _, f := range formats {
		t.Run(string(f), func(t *testing.T) {
			r := newRig(t, f, 100000, reply{toolCall: "screenshot"}, reply{text: "A login form."},
				reply{recall: true, also: "screenshot"}, reply{text: "Both seen."})
			m, _ := r.engine.NewSession(t.Context(), "acme", chat.Settings{Model: "scripted-vl", Recall: true}, chat.Main)
			turn(t, r, m.ID, "Open the login page.", screenshot(1280, 800, 1))
			res := r.call(t, m.ID, user("Compare it with the page now."))
			if res.TurnEnd {
				t.Fatal("the turn ended with the client's call open")
			}
			var recallID, theirs string
			for _, p := range res.Message.Parts {
				if tc, ok := p.(chat.ToolCall); ok && tc.Name == chat.RecallTool {
					recallID = tc.ID
				} else if ok {
					theirs = tc.ID
				}
			}
			answer := func(id string) []chat.Message {
				return []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: id, Parts: []chat.Part{chat.Text{Text: "captured"}, chat.Image{URL: screenshot(1280, 800, 2)}}}}}}
			}
			if _, err := r.engine.Call(t.Context(), "acme", m.ID, answer(recallID)); !errors.Is(err, ErrBadTurn) || !strings.Contains(err.Error(), "imgctx answered itself") {
				t.Fatalf("a result for imgctx's own call: %v", err)
			}
			before := len(r.up.requests)
			end := r.call(t, m.ID, answer(theirs))
			if !end.TurnEnd || len(r.up.requests)-before != 1 || r.up.imageTokens[len(r.up.imageTokens)-1] < 2*1000 {
				t.Fatalf("after the client's answer: turn end %v, %d requests, %d image tokens (the recalled and the new screenshot)",
					end.TurnEnd, len(r.up.requests)-before, r.up.imageTokens[len(r.up.imageTokens)-1])
			}
		})
	}
}
