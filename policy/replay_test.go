package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"pgregory.net/rapid"
)

// Seed replayed-history-images.md, test by test:
//
//	carries an image from turn 1 of a 3-turn history instead of a placeholder  TestReplayCarriesAnOldImage
//	keeps the current turn image first and numbers the historical one after it TestReplayNumbersCurrentFirst
//	bounds history images newest-first and counts what it dropped               TestReplayCapNewestFirst
//	honours MAX_HISTORY_IMAGES=0 as the explicit opt-out, still counted         TestReplayZeroDisables
//	counts history images dropped because a truncated turn is not replayed      TestReplayTruncatedTurns
//	carries the same history image when a resumed request is rebuilt            TestReplayRebuildIsIdentical
//	does not attach history images without vision, and counts them             TestReplayNoVision
//	inner check: the per-turn count cap                                          TestReplayCapInsideOneTurn
//	inner check: the byte cap inside a turn                                      TestReplayBytesInsideOneTurn
//	URL images fetched only if selected, never once caps are exhausted          TestReplayFetchesLazily
//	PDFs travel as text and are counted as document                             TestReplayDocuments
//	one structured log line per request that drops any                          TestReplayLogsOnce
//	properties: attached + dropped = candidates; markers match list order      TestReplayProperties

// resolver stands in for the guarded fetch pipeline: ref images resolve to
// themselves, URL images are "fetched" (counted) with the size in sizes.
type resolver struct {
	sizes   map[string]int64
	fetched []string
}

func (r *resolver) Resolve(_ context.Context, img chat.Image) (chat.Image, error) {
	if img.URL == "" {
		return img, nil
	}
	r.fetched = append(r.fetched, img.URL)
	n, ok := r.sizes[img.URL]
	if !ok {
		return chat.Image{}, errors.New("404")
	}
	img.Ref, img.Bytes, img.MediaType = blob.Of([]byte(img.URL)), n, "image/png"
	return img, nil
}

func hImg(name string, size int64) chat.Image {
	return chat.Image{Ref: blob.Of([]byte(name)), MediaType: "image/png", Bytes: size, Caption: name}
}

// turns builds a history: one user message per turn with the given
// images, then an assistant reply.
func turns(perTurn ...[]chat.Image) []chat.Message {
	msgs := []chat.Message{{Role: chat.System, Parts: []chat.Part{chat.Text{Text: "system"}}}}
	for i, imgs := range perTurn {
		u := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: fmt.Sprintf("question %d", i+1)}}}
		for _, img := range imgs {
			u.Parts = append(u.Parts, img)
		}
		msgs = append(msgs, u, chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: fmt.Sprintf("answer %d", i+1)}}})
	}
	return msgs
}

func build(t *testing.T, hist []chat.Message, current chat.Message, cfg ReplayConfig) Replay {
	t.Helper()
	r, err := BuildReplay(context.Background(), hist, current, cfg, &resolver{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var noImages = chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "now what?"}}}

func refs(as []Attached) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Image.Caption)
	}
	return out
}

func TestReplayCarriesAnOldImage(t *testing.T) {
	r := build(t, turns([]chat.Image{hImg("t1", 1000)}, nil, nil), noImages, DefaultReplay())
	if len(r.Images) != 1 || r.Images[0].Image.Caption != "t1" || r.Images[0].Turn != 0 {
		t.Fatalf("images %v", refs(r.Images))
	}
	if !strings.Contains(r.History, "question 1 [Image #1 attached to this request — from an earlier turn]") {
		t.Fatalf("history lacks the numbered marker:\n%s", r.History)
	}
	if strings.Contains(r.History, "omitted") || r.Counts.DroppedTotal() != 0 {
		t.Fatalf("something was omitted: %+v", r.Counts)
	}
}

func TestReplayNumbersCurrentFirst(t *testing.T) {
	current := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "and this?"}, hImg("now", 10)}}
	r := build(t, turns([]chat.Image{hImg("old", 10)}), current, DefaultReplay())
	if got := refs(r.Images); !reflect.DeepEqual(got, []string{"now", "old"}) || r.Images[0].Turn != -1 {
		t.Fatalf("order %v", got)
	}
	if !strings.Contains(r.History, "[Image #2 attached") {
		t.Fatalf("history image not numbered after the current one:\n%s", r.History)
	}
}

func TestReplayCapNewestFirst(t *testing.T) {
	var per [][]chat.Image
	for i := range 6 {
		per = append(per, []chat.Image{hImg(fmt.Sprint("t", i+1), 1000)})
	}
	r := build(t, turns(per...), noImages, DefaultReplay())
	if got := refs(r.Images); !reflect.DeepEqual(got, []string{"t3", "t4", "t5", "t6"}) {
		t.Fatalf("attached %v; want the 4 newest, chronological", got)
	}
	if r.Counts.Dropped[reason.Cap] != 2 || r.Counts.Attached != 4 {
		t.Fatalf("counts %+v", r.Counts)
	}
	if !strings.Contains(r.History, "[Image not attached: image/png — t1 (cap)]") {
		t.Fatalf("dropped image not marked:\n%s", r.History)
	}
}

func TestReplayZeroDisables(t *testing.T) {
	cfg := DefaultReplay()
	cfg.MaxHistoryImages = 0
	r := build(t, turns([]chat.Image{hImg("a", 10)}, []chat.Image{hImg("b", 10)}), noImages, cfg)
	if len(r.Images) != 0 || r.Counts.Dropped[reason.Cap] != 2 || r.Counts.Candidates != 2 {
		t.Fatalf("images %v counts %+v", refs(r.Images), r.Counts)
	}
}

func TestReplayTruncatedTurns(t *testing.T) {
	cfg := DefaultReplay()
	cfg.MaxHistoryChars = 45 // room for the two newest turns' text only
	r := build(t, turns([]chat.Image{hImg("t1", 10)}, []chat.Image{hImg("t2", 10)}, []chat.Image{hImg("t3", 10)}), noImages, cfg)
	if got := refs(r.Images); !reflect.DeepEqual(got, []string{"t2", "t3"}) {
		t.Fatalf("attached %v", got)
	}
	if r.Counts.Dropped[reason.Truncated] != 1 || !strings.HasPrefix(r.History, "[1 earlier turn(s) omitted]") || strings.Contains(r.History, "question 1") {
		t.Fatalf("counts %+v history:\n%s", r.Counts, r.History)
	}
}

func TestReplayRebuildIsIdentical(t *testing.T) {
	hist := turns([]chat.Image{hImg("a", 10)}, []chat.Image{hImg("b", 20)})
	fresh := build(t, hist, noImages, DefaultReplay())
	// A resumed request rebuilds from the persisted history: a deep copy.
	rebuilt := build(t, chat.CloneMessages(hist), noImages, DefaultReplay())
	if !reflect.DeepEqual(fresh, rebuilt) {
		t.Fatal("a rebuilt request carries something else than a fresh one")
	}
}

func TestReplayNoVision(t *testing.T) {
	cfg := DefaultReplay()
	cfg.Vision = false
	current := chat.Message{Role: chat.User, Parts: []chat.Part{hImg("now", 10)}}
	r := build(t, turns([]chat.Image{hImg("a", 10)}, []chat.Image{hImg("b", 10)}), current, cfg)
	// Nothing attached, the current image included; it is named where it
	// stood, and every image is counted no_vision.
	if len(r.Images) != 0 || !reflect.DeepEqual(r.NotAttached, []string{"[Image not attached: image/png — now (no_vision)]"}) {
		t.Fatalf("attached %v, notes %q; want none attached and the current image named", refs(r.Images), r.NotAttached)
	}
	if r.Counts.Dropped[reason.NoVision] != 3 || r.Counts.Candidates != 3 {
		t.Fatalf("counts %+v", r.Counts)
	}
}

func TestReplayCapInsideOneTurn(t *testing.T) {
	var many []chat.Image
	for i := range 6 {
		many = append(many, hImg(fmt.Sprint("m", i), 10))
	}
	r := build(t, turns(many), noImages, DefaultReplay())
	if len(r.Images) != 4 || r.Counts.Dropped[reason.Cap] != 2 {
		t.Fatalf("one turn overran the cap: %v %+v", refs(r.Images), r.Counts)
	}
}

func TestReplayBytesInsideOneTurn(t *testing.T) {
	r := build(t, turns([]chat.Image{hImg("small", 100_000), hImg("huge", 1_700_000), hImg("mid", 900_000)}), noImages, DefaultReplay())
	if got := refs(r.Images); !reflect.DeepEqual(got, []string{"small", "mid"}) {
		t.Fatalf("attached %v", got)
	}
	if r.Counts.Dropped[reason.Bytes] != 1 {
		t.Fatalf("counts %+v", r.Counts)
	}
	var total int64
	for _, a := range r.Images {
		total += a.Image.Bytes
	}
	if total > DefaultReplay().MaxHistoryImageBytes {
		t.Fatalf("%d bytes attached over the cap", total)
	}
}

func TestReplayFetchesLazily(t *testing.T) {
	url := func(u string) chat.Image { return chat.Image{URL: u, Caption: u} }
	res := &resolver{sizes: map[string]int64{"https://x/new.png": 100, "https://x/old.png": 100}}
	cfg := DefaultReplay()
	cfg.MaxHistoryImages = 2
	hist := turns([]chat.Image{url("https://x/oldest.png")}, []chat.Image{url("https://x/old.png")},
		[]chat.Image{url("https://x/broken.png")}, []chat.Image{url("https://x/new.png")})
	r, err := BuildReplay(context.Background(), hist, noImages, cfg, res, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := refs(r.Images); !reflect.DeepEqual(got, []string{"https://x/old.png", "https://x/new.png"}) {
		t.Fatalf("attached %v", got)
	}
	if !reflect.DeepEqual(res.fetched, []string{"https://x/new.png", "https://x/broken.png", "https://x/old.png"}) {
		t.Fatalf("fetched %v; the oldest must not be fetched once the cap is full", res.fetched)
	}
	if r.Counts.Dropped[reason.FetchFailed] != 1 || r.Counts.Dropped[reason.Cap] != 1 {
		t.Fatalf("counts %+v", r.Counts)
	}
}

func TestReplayDocuments(t *testing.T) {
	hist := turns(nil)
	hist[1].Parts = append(hist[1].Parts, chat.Document{MediaType: "application/pdf", Text: "page one text"})
	r := build(t, hist, noImages, DefaultReplay())
	if r.Counts.Dropped[reason.Document] != 1 || !strings.Contains(r.History, "[document: application/pdf]\npage one text") {
		t.Fatalf("counts %+v history:\n%s", r.Counts, r.History)
	}
}

func TestReplayLogsOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	cfg := DefaultReplay()
	cfg.MaxHistoryImages = 1
	BuildReplay(context.Background(), turns([]chat.Image{hImg("a", 1)}, []chat.Image{hImg("b", 1)}), noImages, cfg, &resolver{}, log)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "count=1") || !strings.Contains(lines[0], "cap=1") || !strings.Contains(lines[0], "attached=1") {
		t.Fatalf("log: %q", buf.String())
	}
	buf.Reset()
	BuildReplay(context.Background(), turns([]chat.Image{hImg("a", 1)}), noImages, DefaultReplay(), &resolver{}, log)
	if buf.Len() != 0 {
		t.Fatalf("logged without a drop: %q", buf.String())
	}
}

var markerRe = regexp.MustCompile(`\[Image #(\d+) attached`)

func TestReplayProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		nTurns := rapid.IntRange(0, 8).Draw(rt, "turns")
		var per [][]chat.Image
		id := 0
		for range nTurns {
			var imgs []chat.Image
			for range rapid.IntRange(0, 4).Draw(rt, "imgs") {
				id++
				imgs = append(imgs, hImg(fmt.Sprint("i", id), int64(rapid.IntRange(1, 900_000).Draw(rt, "size"))))
			}
			per = append(per, imgs)
		}
		hist := turns(per...)
		if rapid.Bool().Draw(rt, "doc") && len(hist) > 1 {
			hist[1].Parts = append(hist[1].Parts, chat.Document{MediaType: "application/pdf"})
		}
		cfg := ReplayConfig{
			MaxHistoryImages:     rapid.IntRange(0, 6).Draw(rt, "cap"),
			MaxHistoryImageBytes: int64(rapid.IntRange(0, 3_000_000).Draw(rt, "bytes")),
			MaxHistoryChars:      rapid.IntRange(0, 200).Draw(rt, "chars"),
			Vision:               rapid.Bool().Draw(rt, "vision"),
		}
		current := noImages
		if rapid.Bool().Draw(rt, "current") {
			current = chat.Message{Role: chat.User, Parts: []chat.Part{hImg("now", 5), hImg("now2", 5)}}
		}
		r, err := BuildReplay(context.Background(), hist, current, cfg, &resolver{}, nil)
		if err != nil {
			rt.Fatal(err)
		}
		c := r.Counts
		if c.Attached+c.DroppedTotal() != c.Candidates {
			rt.Fatalf("attached %d + dropped %d != candidates %d", c.Attached, c.DroppedTotal(), c.Candidates)
		}
		k := len(current.Images())
		if !cfg.Vision {
			// Nothing is attached, the current images included: each is
			// named in a note and counted no_vision.
			if len(r.NotAttached) != k || len(r.Images) != 0 || c.Dropped[reason.NoVision] < k {
				rt.Fatalf("no vision: %d notes, %d images, %d no_vision for %d current images", len(r.NotAttached), len(r.Images), c.Dropped[reason.NoVision], k)
			}
			k = 0
		}
		if len(r.Images) != k+c.Attached || c.Attached > cfg.MaxHistoryImages {
			rt.Fatalf("%d images for %d current + %d attached (cap %d)", len(r.Images), k, c.Attached, cfg.MaxHistoryImages)
		}
		var total int64
		for i, a := range r.Images {
			if a.Ordinal != i+1 {
				rt.Fatalf("ordinal %d at position %d", a.Ordinal, i+1)
			}
			if i >= k {
				total += a.Image.Bytes
			}
		}
		if total > cfg.MaxHistoryImageBytes {
			rt.Fatalf("%d history bytes over the cap %d", total, cfg.MaxHistoryImageBytes)
		}
		// Markers name the list entries in list order, each inside the text
		// of the turn its image came from.
		ms := markerRe.FindAllStringSubmatchIndex(r.History, -1)
		if len(ms) != c.Attached {
			rt.Fatalf("%d markers for %d attached images", len(ms), c.Attached)
		}
		for i, m := range ms {
			n, _ := strconv.Atoi(r.History[m[2]:m[3]])
			if n != k+i+1 {
				rt.Fatalf("marker %d names #%d; want #%d", i, n, k+i+1)
			}
			turn := r.Images[n-1].Turn
			start := strings.Index(r.History, fmt.Sprintf("question %d ", turn+1))
			end := strings.Index(r.History, fmt.Sprintf("question %d ", turn+2))
			if start < 0 || m[0] < start || (end >= 0 && m[0] > end) {
				rt.Fatalf("marker #%d is not in the text of turn %d", n, turn+1)
			}
		}
	})
}
