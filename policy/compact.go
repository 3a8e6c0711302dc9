package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/mimetype"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
)

// SlimStats counts what Slim replaced.
type SlimStats struct {
	Images    int `json:"images"`
	Documents int `json:"documents"`
	DataURLs  int `json:"data_urls"` // data URLs found inside text
}

// Slim returns the summariser's copy of msgs: every image becomes
// "[image: <mime>]" and every document "[document: <mime>]" (with " — caption"
// when known), at any depth inside tool results, and data URLs pasted into
// text become the same placeholder. MIME types are sanitised. msgs is never
// modified, and when nothing needs replacing the very same slice comes back.
// No base64 and no image bytes survive it.
func Slim(msgs []chat.Message) ([]chat.Message, SlimStats) {
	var st SlimStats
	out := edit(msgs, func(_ int, p chat.Part, _ int) ([]chat.Part, bool) {
		switch p := p.(type) {
		case chat.Image:
			st.Images++
			return []chat.Part{chat.Text{Text: placeholder("image", p.MediaType, p.Caption)}}, true
		case chat.Document:
			st.Documents++
			return []chat.Part{chat.Text{Text: placeholder("document", p.MediaType, p.Caption)}}, true
		case chat.Text:
			if s, n := stripDataURLs(p.Text); n > 0 {
				st.DataURLs += n
				return []chat.Part{chat.Text{Text: s}}, true
			}
		case chat.Opaque:
			// A provider block imgctx does not read (thinking, server tools,
			// audio) may hold anything, base64 included: the summariser gets
			// its name only.
			return []chat.Part{chat.Text{Text: "[" + p.Wire + " " + opaqueType(p.Raw) + " block]"}}, true
		}
		return nil, false
	})
	return out, st
}

// opaqueType reads the "type" of an opaque part's JSON; it is the client's
// string, so only a short identifier is taken as it is.
func opaqueType(raw string) string {
	var v struct {
		Type string `json:"type"`
	}
	if json.Unmarshal([]byte(raw), &v) != nil || v.Type == "" || len(v.Type) > 64 ||
		strings.IndexFunc(v.Type, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') }) >= 0 {
		return "unknown"
	}
	return v.Type
}

func placeholder(of, mediaType, caption string) string {
	s := "[" + of + ": " + mimetype.Sanitize(mediaType)
	if caption != "" {
		s += " — " + caption
	}
	return s + "]"
}

// stripDataURLs replaces "data:<type>;base64,<payload>" spans in text by a
// placeholder, returning the text and how many it replaced.
func stripDataURLs(s string) (string, int) {
	if !strings.Contains(s, ";base64,") {
		return s, 0
	}
	var b strings.Builder
	n := 0
	for {
		i := strings.Index(s, "data:")
		if i < 0 {
			break
		}
		rest := s[i+len("data:"):]
		semi := strings.Index(rest, ";base64,")
		if semi < 0 || semi > 100 || strings.ContainsAny(rest[:semi], " \n\t\"'") {
			b.WriteString(s[:i+len("data:")])
			s = rest
			continue
		}
		end := semi + len(";base64,")
		for end < len(rest) && tokens.Base64Byte(rest[end]) {
			end++
		}
		of := "image"
		if !strings.HasPrefix(rest[:semi], "image/") {
			of = "document"
		}
		b.WriteString(s[:i])
		b.WriteString(placeholder(of, rest[:semi], ""))
		s = rest[end:]
		n++
	}
	b.WriteString(s)
	return b.String(), n
}

// CompactConfig tunes compaction. Zero fields take the defaults.
type CompactConfig struct {
	// PreserveFraction of the characters stays verbatim at the end; the
	// summarised prefix covers at least 1 − PreserveFraction. Default 0.3.
	PreserveFraction float64
	// MinCompressionFraction: no summary when the prefix is under this share
	// of the whole. Default 0.05.
	MinCompressionFraction float64
	// ImageTokenEstimate prices an image or document in the character
	// accounting; default tokens.DefaultImageTokenEstimate.
	ImageTokenEstimate int
	// RestoreImages is how many of the most recent images the summary
	// covers are re-attached after it, so the model still sees the current
	// screen; default 3, negative for none.
	RestoreImages int
}

func (c CompactConfig) restore() int {
	switch {
	case c.RestoreImages < 0:
		return 0
	case c.RestoreImages == 0:
		return 3
	}
	return c.RestoreImages
}

func (c CompactConfig) preserve() float64 {
	if c.PreserveFraction > 0 {
		return c.PreserveFraction
	}
	return 0.3
}

func (c CompactConfig) minFraction() float64 {
	if c.MinCompressionFraction > 0 {
		return c.MinCompressionFraction
	}
	return 0.05
}

// Summariser writes a summary of messages. The engine implements it as a
// side query to the same upstream; it only ever receives Slim's output.
type Summariser interface {
	Summarise(ctx context.Context, msgs []chat.Message) (string, error)
}

// SharedSummariser is a Summariser that can also summarise from the live
// context itself: the exact prefix the provider has cached, images
// included, read at the cache's price, plus one instruction.
// SummariseShared says ok false when that does not apply (the cache is
// cold); a failure falls back to the slimmed summary too.
type SharedSummariser interface {
	Summariser
	SummariseShared(ctx context.Context, msgs []chat.Message, start, split int) (text string, ok bool, err error)
}

// ErrNotWorthCompacting is returned when there is no split point or the
// prefix is under MinCompressionFraction of the whole.
var ErrNotWorthCompacting = errors.New("not enough history to compact")

// CompactionRecord is what the persisted log keeps of a compaction: the
// original messages stay in the log; the record says which ones the summary
// replaces in the live context, so resume and export stay lossless.
type CompactionRecord struct {
	From        int       `json:"from"` // messages [From, To) of the history given to Compact
	To          int       `json:"to"`
	Summary     string    `json:"summary"`
	TotalChars  int       `json:"total_chars"`
	PrefixChars int       `json:"prefix_chars"`
	Slimmed     SlimStats `json:"slimmed"`
	// Shared: the summary came from the live, cached prefix, not from a
	// slimmed copy.
	Shared bool `json:"shared,omitempty"`
	// Restored counts the images re-attached after the summary.
	Restored int `json:"restored,omitempty"`
}

// Compacted is the result of Compact.
type Compacted struct {
	Messages []chat.Message // the new live context: leading system messages, the summary, the tail
	Record   CompactionRecord
	Removed  []Removal // images and documents the summary now covers
}

// Compact summarises a prefix of msgs. Character counts are computed once
// and shared by the split point and the guard; the summariser receives the
// slimmed prefix only. Leading system messages are never summarised.
func Compact(ctx context.Context, msgs []chat.Message, cfg CompactConfig, s Summariser) (Compacted, error) {
	counts := tokens.CharCounts(nil, msgs, cfg.ImageTokenEstimate)
	split := SplitPoint(msgs, counts, cfg.preserve())
	start := leadingSystem(msgs)
	// The guard weighs what a summary saves that nothing cheaper would:
	// kept images leave before any summary (an eviction batch), so their
	// weight never makes one worth its call.
	worth := counts
	if KeptCost(msgs) > 0 {
		slim, _ := RemoveKept(msgs, reason.Compaction)
		worth = tokens.CharCounts(nil, slim, cfg.ImageTokenEstimate)
	}
	if split < 0 || !WorthCompacting(worth, start, split, cfg.minFraction()) {
		// One instruction and a long tool loop has no user boundary worth
		// cutting at: cut between tool rounds instead.
		split = RoundSplitPoint(msgs, counts, cfg.preserve())
	}
	if split < 0 || !WorthCompacting(worth, start, split, cfg.minFraction()) {
		return Compacted{}, ErrNotWorthCompacting
	}
	var text string
	var st SlimStats
	shared := false
	if ss, ok := s.(SharedSummariser); ok {
		t, ok, err := ss.SummariseShared(ctx, msgs, start, split)
		if ok && err == nil && t != "" {
			text, shared = t, true
		}
	}
	if !shared {
		var slim []chat.Message
		slim, st = Slim(msgs[start:split])
		var err error
		if text, err = s.Summarise(ctx, slim); err != nil {
			return Compacted{}, fmt.Errorf("summarise: %w", err)
		}
	}
	restored := restoreImages(msgs[start:split], cfg.restore())
	lines := imageLines(text)
	for i := range restored {
		if r := &restored[i]; r.img.Caption == "" {
			r.img.Caption = lines[r.ordinal] // the summariser's line for it, if any
		}
	}
	var removed []Removal
	k := 0
	for i, m := range msgs[start:split] {
		j := 0 // the image's index in its message
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			switch p := p.(type) {
			case chat.Image:
				j++
				if k < len(restored) && restored[k].at == [2]int{i, j - 1} {
					k++ // re-attached after the summary: not removed
					return true
				}
				removed = append(removed, Removal{Ref: p.Ref, Of: "image", Reason: reason.Compaction, Message: start + i, Cost: p.Cost})
			case chat.Document:
				removed = append(removed, Removal{Ref: p.Ref, Of: "document", Reason: reason.Compaction, Message: start + i})
			}
			return true
		})
	}
	parts := []chat.Part{chat.Summary{Text: text, From: start, To: split}}
	for _, r := range restored {
		parts = append(parts, r.img)
	}
	out := make([]chat.Message, 0, start+1+len(msgs)-split)
	out = append(out, msgs[:start]...)
	out = append(out, chat.Message{Role: chat.User, Parts: parts})
	out = append(out, msgs[split:]...)
	chat.Unlink(out[start+1:]) // they stand after the summary now
	total, prefix := sum(counts[start:]), sum(counts[start:split])
	return Compacted{
		Messages: out,
		Record: CompactionRecord{From: start, To: split, Summary: text, TotalChars: total, PrefixChars: prefix, Slimmed: st,
			Shared: shared, Restored: len(restored)},
		Removed: removed,
	}, nil
}

type restoredImage struct {
	at      [2]int // message (in the prefix) and the image's index among that message's images
	ordinal int    // 1-based, among all the prefix's images, as the summariser numbers them
	img     chat.Image
}

// imageLines reads the summariser's "Image N: …" lines: what each image of
// the summarised part showed, by ordinal, bounded like any caption.
func imageLines(summary string) map[int]string {
	out := map[int]string{}
	for _, line := range strings.Split(summary, "\n") {
		line = strings.TrimLeft(strings.TrimSpace(line), "-*• ")
		rest, ok := strings.CutPrefix(line, "Image ")
		if !ok {
			continue
		}
		num, what, ok := strings.Cut(rest, ":")
		n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(num), "#"))
		if ok && err == nil && n > 0 && strings.TrimSpace(what) != "" {
			out[n] = bounded(what)
		}
	}
	return out
}

// restoreImages picks the n most recent images of the prefix the model may
// still see — the user's, and tool images kept at a measured cost — in
// chronological order, to stand after the summary.
func restoreImages(prefix []chat.Message, n int) []restoredImage {
	var all []restoredImage
	ordinal := 0
	for i, m := range prefix {
		j := 0
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			if img, ok := p.(chat.Image); ok {
				ordinal++
				if img.Ref.Valid() && (img.Keep == "" || img.Keep == chat.Kept) {
					img.Occ = 0
					all = append(all, restoredImage{[2]int{i, j}, ordinal, img})
				}
				j++
			}
			return true
		})
	}
	return all[max(len(all)-n, 0):]
}

func leadingSystem(msgs []chat.Message) int {
	n := 0
	for n < len(msgs) && msgs[n].Role == chat.System {
		n++
	}
	return n
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// SplitPoint returns the index where the summarised prefix ends: the first
// user-turn boundary (a user message) at which the prefix, leading system
// messages excluded, holds at least 1 − preserve of the characters, and
// before which every tool call has its result. When no boundary reaches
// that share, the last valid boundary; -1 when there is none. counts are
// tokens.CharCounts of msgs.
func SplitPoint(msgs []chat.Message, counts []int, preserve float64) int {
	start := leadingSystem(msgs)
	target := (1 - preserve) * float64(sum(counts[start:]))
	open := map[string]bool{} // tool calls without a result yet
	cum, last := 0, -1
	for k := start; k < len(msgs); k++ {
		if k > start && msgs[k].Role == chat.User && len(open) == 0 {
			last = k
			if float64(cum) >= target {
				return k
			}
		}
		cum += counts[k]
		for _, p := range msgs[k].Parts {
			switch p := p.(type) {
			case chat.ToolCall:
				open[p.ID] = true
			case chat.ToolResult:
				delete(open, p.CallID)
			}
		}
	}
	return last
}

// RoundSplitPoint is SplitPoint for a history whose user boundaries leave
// nothing worth summarising (one instruction, then hundreds of tool calls):
// it cuts before an assistant message that starts a tool round, where every
// earlier call has its result, so a call and its result are never parted.
// The tail keeps at least preserve of the characters, hence the most
// recent complete rounds and the call in flight. The summary, a user
// message, then stands before the tail's first assistant message, so the
// roles still alternate. -1 when there is no such point.
func RoundSplitPoint(msgs []chat.Message, counts []int, preserve float64) int {
	start := leadingSystem(msgs)
	target := (1 - preserve) * float64(sum(counts[start:]))
	open := map[string]bool{}
	cum, last := 0, -1
	for k := start; k < len(msgs); k++ {
		if k > start+1 && msgs[k].Role == chat.Assistant && len(open) == 0 {
			if float64(cum) > target {
				break
			}
			last = k
		}
		cum += counts[k]
		for _, p := range msgs[k].Parts {
			switch p := p.(type) {
			case chat.ToolCall:
				open[p.ID] = true
			case chat.ToolResult:
				delete(open, p.CallID)
			}
		}
	}
	return last
}

// WorthCompacting is the guard: the prefix [start, split) must hold at least
// minFraction of the characters from start on.
func WorthCompacting(counts []int, start, split int, minFraction float64) bool {
	total := sum(counts[start:])
	return total > 0 && split > start && float64(sum(counts[start:split])) >= minFraction*float64(total)
}
