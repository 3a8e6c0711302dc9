package policy

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"pgregory.net/rapid"
)

func keptImage(name string, cost int) chat.Image {
	return chat.Image{Ref: blob.Of([]byte(name)), MediaType: "image/png", Caption: name, Origin: chat.FromTool, Keep: chat.Kept, Cost: cost}
}

// history of n turns, each with a tool result keeping one image.
func keptHistory(costs ...int) []chat.Message {
	var msgs []chat.Message
	for i, c := range costs {
		msgs = append(msgs,
			chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: fmt.Sprintf("turn %d", i)}}},
			chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Parts: []chat.Part{keptImage(fmt.Sprint("img", i), c)}}}},
		)
	}
	return msgs
}

func TestEvictOldestFirstDownToLowWater(t *testing.T) {
	msgs := keptHistory(1000, 1000, 1000, 1000)
	before := chat.CloneMessages(msgs)
	// 10500 over a 10000 threshold: the low-water mark is 9000, so the two
	// oldest images (≈1000 each, less their markers) must go; no more.
	out, removed, after := EvictImages(msgs, Pressure{Estimate: 10500, Threshold: 10000}, reason.Budget)
	if len(removed) != 2 || removed[0].Message != 1 || removed[1].Message != 3 {
		t.Fatalf("removed %+v; want the two oldest", removed)
	}
	if after > 9000 || after < 8000 {
		t.Fatalf("estimate after %d; want just under the low-water mark 9000", after)
	}
	if KeptCost(out) != 2000 {
		t.Fatalf("still kept %d; want 2000", KeptCost(out))
	}
	if !reflect.DeepEqual(before, msgs) {
		t.Fatal("eviction mutated the live history")
	}
	_, markers := imagesIn(out)
	if len(markers) != 2 || markers[0].Reason != "budget" || markers[0].Caption != "img0" {
		t.Fatalf("markers %+v", markers)
	}
}

func TestEvictNothingUnderThreshold(t *testing.T) {
	msgs := keptHistory(1000)
	out, removed, after := EvictImages(msgs, Pressure{Estimate: 9999, Threshold: 10000}, reason.Budget)
	if len(removed) != 0 || after != 9999 || &out[0] != &msgs[0] {
		t.Fatal("evicted under the threshold")
	}
}

func TestEvictLeavesUserImagesAndReportsShortfall(t *testing.T) {
	user := chat.Image{Ref: blob.Of([]byte("u")), MediaType: "image/png", Origin: chat.FromUser}
	msgs := append([]chat.Message{{Role: chat.User, Parts: []chat.Part{user}}}, keptHistory(500)...)
	out, removed, after := EvictImages(msgs, Pressure{Estimate: 20000, Threshold: 10000, LowWater: 8000}, reason.Overflow)
	if len(removed) != 1 || removed[0].Reason != reason.Overflow {
		t.Fatalf("removed %+v", removed)
	}
	if after <= 10000 {
		t.Fatalf("after %d: removing every kept image is not enough, and the caller must see it", after)
	}
	if imgs, _ := imagesIn(out); len(imgs) != 1 || imgs[0].Origin != chat.FromUser {
		t.Fatal("a user image was evicted: only kept tool images leave first")
	}
}

// Properties: eviction is deterministic (same input, same output) and
// monotonic (a removed image stays removed in later calls).
func TestEvictDeterministicAndMonotonic(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		costs := rapid.SliceOfN(rapid.IntRange(0, 3000), 1, 12).Draw(rt, "costs")
		msgs := keptHistory(costs...)
		total := 0
		for _, c := range costs {
			total += c
		}
		threshold := rapid.IntRange(1000, 50000).Draw(rt, "threshold")
		p := Pressure{Estimate: threshold + rapid.IntRange(-500, total).Draw(rt, "over"), Threshold: threshold}
		a, ra, ea := EvictImages(msgs, p, reason.Budget)
		b, rb, eb := EvictImages(msgs, p, reason.Budget)
		if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(ra, rb) || ea != eb {
			rt.Fatal("two runs on the same input differ")
		}
		// A later call under more pressure removes a superset.
		p2 := p
		p2.Estimate = ea + rapid.IntRange(0, total).Draw(rt, "more")
		c, _, _ := EvictImages(a, p2, reason.Budget)
		_, ma := imagesIn(a)
		_, mc := imagesIn(c)
		if len(mc) < len(ma) {
			rt.Fatal("an evicted image came back")
		}
		for i := range ma {
			if ma[i].Ref != mc[i].Ref {
				rt.Fatal("markers changed order or identity")
			}
		}
	})
}

func TestRemoveKeptTakesEveryKeptImage(t *testing.T) {
	msgs := keptHistory(10, 20, 30)
	out, removed := RemoveKept(msgs, reason.Overflow)
	if len(removed) != 3 || KeptCost(out) != 0 || removed[2].Reason != reason.Overflow {
		t.Fatalf("removed %+v", removed)
	}
}
