package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/tokens"
)

// history2000 is 2,000 messages with 200 images, half of them inside tool
// results; slimmed is the same history already slimmed (nothing to change).
func history2000() (withImages, slimmed []chat.Message) {
	text := strings.Repeat("some words of a long agent conversation ", 5)
	for i := range 2000 {
		m := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: text}}}
		if i%10 == 0 {
			img := chat.Image{Ref: blob.Of([]byte{byte(i), byte(i >> 8)}), MediaType: "image/png"}
			if i%20 == 0 {
				m = chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: fmt.Sprint(i), Name: "shot", Parts: []chat.Part{chat.Text{Text: "ok"}, img}}}}
			} else {
				m.Parts = append(m.Parts, img)
			}
		}
		withImages = append(withImages, m)
	}
	slimmed, _ = Slim(withImages)
	return withImages, slimmed
}

// BenchmarkSlim: target under 1 ms for 2,000 messages and 200 images, and
// no allocation when nothing changes. The baseline is a plain deep Clone of
// the same history, the least a copying slimmer would pay.
func BenchmarkSlim(b *testing.B) {
	with, slimmed := history2000()
	b.Run("200-images", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Slim(with)
		}
	})
	b.Run("nothing-to-change", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Slim(slimmed)
		}
	})
	b.Run("baseline=deep-clone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			chat.CloneMessages(with)
		}
	})
}

// BenchmarkCharAccounting: the counts compaction shares between the split
// point and the guard, for the same history, then the split and the guard.
func BenchmarkCharAccounting(b *testing.B) {
	with, _ := history2000()
	buf := make([]int, 0, len(with))
	b.ReportAllocs()
	for b.Loop() {
		buf = tokens.CharCounts(buf, with, 0)
		k := SplitPoint(with, buf, 0.3)
		WorthCompacting(buf, 0, k, 0.05)
	}
}

// BenchmarkReplay100Turns: target under 100 µs to build the replay of 100
// turns, each with an image.
func BenchmarkReplay100Turns(b *testing.B) {
	var per [][]chat.Image
	for i := range 100 {
		per = append(per, []chat.Image{hImg(fmt.Sprint("t", i), 200_000)})
	}
	hist := turns(per...)
	current := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "now?"}, hImg("now", 1000)}}
	res := &resolver{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := BuildReplay(ctx, hist, current, DefaultReplay(), res, nil); err != nil {
			b.Fatal(err)
		}
	}
}
