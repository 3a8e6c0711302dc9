package engine

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
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
