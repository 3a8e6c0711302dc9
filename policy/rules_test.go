package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"pgregory.net/rapid"
)

// fakeShrinker scales to fit like media.Shrink would, and can fail.
type fakeShrinker struct {
	fail  bool
	calls int
}

func (f *fakeShrinker) Shrink(_ context.Context, img chat.Image, maxEdge int, maxBytes int64) (chat.Image, error) {
	f.calls++
	if f.fail {
		return chat.Image{}, errors.New("undecodable")
	}
	if maxEdge > 0 && max(img.Width, img.Height) > maxEdge {
		if img.Width >= img.Height {
			img.Height, img.Width = img.Height*maxEdge/img.Width, maxEdge
		} else {
			img.Width, img.Height = img.Width*maxEdge/img.Height, maxEdge
		}
	}
	if maxBytes > 0 && img.Bytes > maxBytes {
		img.Bytes = maxBytes
	}
	img.Ref = blob.Of([]byte(fmt.Sprint(img.Ref, maxEdge, maxBytes)))
	return img, nil
}

var anthropic = tokens.Limits{MaxImages: 100, MaxImageBytes: 5 << 20, MaxEdge: 8000, ManyImagesAbove: 20, ManyImagesMaxEdge: 2000}

func sized(i, w, h int, bytes int64) chat.Image {
	return chat.Image{Ref: blob.Of([]byte(fmt.Sprint(i))), MediaType: "image/png", Width: w, Height: h, Bytes: bytes, Caption: fmt.Sprint("img", i)}
}

func request(imgs ...chat.Image) []chat.Message {
	var msgs []chat.Message
	for _, img := range imgs {
		msgs = append(msgs, chat.Message{Role: chat.User, Parts: []chat.Part{img}})
	}
	return msgs
}

func TestRulesFittingRequestUnchanged(t *testing.T) {
	msgs := request(sized(1, 1920, 1080, 300_000), sized(2, 800, 600, 100_000))
	out, removed, shrunk := CheckProviderRules(context.Background(), msgs, anthropic, &fakeShrinker{})
	if &out[0] != &msgs[0] || removed != nil || shrunk != nil {
		t.Fatal("a fitting request was changed")
	}
}

func TestRulesManyImageRule(t *testing.T) {
	var imgs []chat.Image
	for i := range 21 {
		imgs = append(imgs, sized(i, 2500, 1400, 400_000))
	}
	sh := &fakeShrinker{}
	out, removed, shrunk := CheckProviderRules(context.Background(), request(imgs...), anthropic, sh)
	if len(shrunk) != 21 || len(removed) != 0 {
		t.Fatalf("21 images of 2500 px: %d shrunk, %d removed; want all shrunk to 2000", len(shrunk), len(removed))
	}
	for _, m := range out {
		if w := m.Parts[0].(chat.Image).Width; w != 2000 {
			t.Fatalf("width %d after the many-image rule", w)
		}
	}
	// 20 images: the many-image rule does not apply.
	_, _, shrunk = CheckProviderRules(context.Background(), request(imgs[:20]...), anthropic, sh)
	if len(shrunk) != 0 {
		t.Fatalf("20 images shrunk: %d", len(shrunk))
	}
	// Without a shrinker each violating image becomes a marker.
	_, removed, _ = CheckProviderRules(context.Background(), request(imgs...), anthropic, nil)
	if len(removed) != 21 || removed[0].Reason != reason.ProviderLimit {
		t.Fatalf("removed %d", len(removed))
	}
}

func TestRulesTooManyImagesOldestLeave(t *testing.T) {
	lim := tokens.Limits{MaxImages: 3}
	out, removed, _ := CheckProviderRules(context.Background(), request(sized(1, 10, 10, 1), sized(2, 10, 10, 1), sized(3, 10, 10, 1), sized(4, 10, 10, 1), sized(5, 10, 10, 1)), lim, nil)
	if len(removed) != 2 || removed[0].Message != 0 || removed[1].Message != 1 {
		t.Fatalf("removed %+v; want the two oldest", removed)
	}
	if m, ok := out[0].Parts[0].(chat.Marker); !ok || m.Caption != "img1" || m.Reason != "provider_limit" {
		t.Fatalf("marker %+v", out[0].Parts[0])
	}
}

func TestRulesBytesAndFailedShrink(t *testing.T) {
	big := sized(1, 1000, 1000, 6<<20)
	out, _, shrunk := CheckProviderRules(context.Background(), request(big), anthropic, &fakeShrinker{})
	if len(shrunk) != 1 || out[0].Parts[0].(chat.Image).Bytes > 5<<20 {
		t.Fatalf("not shrunk under 5 MB: %+v", out[0].Parts[0])
	}
	_, removed, _ := CheckProviderRules(context.Background(), request(big), anthropic, &fakeShrinker{fail: true})
	if len(removed) != 1 || removed[0].Reason != reason.ProviderLimit {
		t.Fatalf("a failed shrink must leave a marker: %+v", removed)
	}
}

// Property: after the check, every image left meets every limit, and every
// image that left is counted.
func TestRulesProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		lim := tokens.Limits{
			MaxImages:         rapid.IntRange(0, 30).Draw(rt, "max"),
			MaxImageBytes:     int64(rapid.IntRange(0, 5<<20).Draw(rt, "bytes")),
			MaxEdge:           rapid.IntRange(0, 8000).Draw(rt, "edge"),
			ManyImagesAbove:   rapid.IntRange(0, 20).Draw(rt, "many"),
			ManyImagesMaxEdge: rapid.IntRange(0, 2000).Draw(rt, "manyedge"),
		}
		n := rapid.IntRange(0, 40).Draw(rt, "n")
		var imgs []chat.Image
		for i := range n {
			imgs = append(imgs, sized(i, rapid.IntRange(1, 9000).Draw(rt, "w"), rapid.IntRange(1, 9000).Draw(rt, "h"), int64(rapid.IntRange(1, 8<<20).Draw(rt, "b"))))
		}
		var sh Shrinker
		if rapid.Bool().Draw(rt, "shrink") {
			sh = &fakeShrinker{}
		}
		out, removed, _ := CheckProviderRules(context.Background(), request(imgs...), lim, sh)
		var left []chat.Image
		for _, m := range out {
			left = append(left, m.Images()...)
		}
		if len(left)+len(removed) != n {
			rt.Fatalf("%d left + %d removed != %d", len(left), len(removed), n)
		}
		if lim.MaxImages > 0 && len(left) > lim.MaxImages {
			rt.Fatalf("%d images over the limit %d", len(left), lim.MaxImages)
		}
		edge := lim.MaxEdge
		if lim.ManyImagesAbove > 0 && len(left) > lim.ManyImagesAbove && lim.ManyImagesMaxEdge > 0 && (edge == 0 || lim.ManyImagesMaxEdge < edge) {
			edge = lim.ManyImagesMaxEdge
		}
		for _, img := range left {
			if violation(img, edge, lim.MaxImageBytes) != "" {
				rt.Fatalf("%+v breaks a limit", img)
			}
		}
	})
}

// Each shrunk image gets its note right after it, nested ones included;
// nothing else changes and the input is not modified.
func TestNoteResized(t *testing.T) {
	small := chat.Image{Ref: blob.Of([]byte("small")), Width: 400, Height: 250}
	msgs := []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Parts: []chat.Part{small, chat.Text{Text: "after"}}}}}}
	out := NoteResized(msgs, []Shrunk{{From: chat.Image{Width: 1280, Height: 800}, To: small}})
	tr := out[0].Parts[0].(chat.ToolResult)
	if len(tr.Parts) != 3 || tr.Parts[1].(chat.Text).Text != ResizeNote(1280, 800, 400, 250) || tr.Parts[2].(chat.Text).Text != "after" {
		t.Fatalf("got %#v", tr.Parts)
	}
	if len(msgs[0].Parts[0].(chat.ToolResult).Parts) != 2 {
		t.Fatal("the input was modified")
	}
	if got := ResizeNote(1280, 800, 400, 250); !strings.Contains(got, "1280x800 to 400x250") || !strings.Contains(got, "by 3.2 ") {
		t.Fatalf("note %q", got)
	}
}
