package policy

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/mimetype"
	"github.com/imgctx/imgctx/reason"
)

// ReplayConfig bounds history images on a flat-list wire. Start from
// DefaultReplay: a zero cap is taken literally (no history images, each one
// still counted).
type ReplayConfig struct {
	MaxHistoryImages     int   // at most this many history images; default 4
	MaxHistoryImageBytes int64 // and at most this many bytes of them; default 1.6 MB
	MaxHistoryChars      int   // history text budget; older turns past it are truncated; 0 = none
	Vision               bool  // the wire renders images at all
	// Handle, when set, names the recall handle of an image not attached,
	// for its note ("" for none).
	Handle func(chat.Image, reason.Code) string `yaml:"-" json:"-"`
}

// DefaultReplay returns the seed's defaults: 4 images, 1.6 MB (4 × the 400 KB
// shrink target), no text budget, vision on.
func DefaultReplay() ReplayConfig {
	return ReplayConfig{MaxHistoryImages: 4, MaxHistoryImageBytes: 1_600_000, Vision: true}
}

// Resolver fills in what attaching a history image needs (its ref, size and
// type), fetching a URL image through the guarded pipeline. BuildReplay calls
// it only for images it may still attach: once the caps are exhausted,
// nothing more is fetched.
type Resolver interface {
	Resolve(ctx context.Context, img chat.Image) (chat.Image, error)
}

// Attached is one entry of the flat image list.
type Attached struct {
	Ordinal int        // 1-based position in the list; the marker in the text names it
	Image   chat.Image // resolved
	Turn    int        // index of its turn in the history; -1 for the current turn
}

// ReplayCounts says what happened to the history's images and documents
// (and, for a wire without vision, the current message's images).
// Attached + the sum of Dropped = Candidates, always.
type ReplayCounts struct {
	Turns      int
	Candidates int
	Attached   int
	Dropped    map[reason.Code]int
}

// DroppedTotal is the number of candidates not attached.
func (c ReplayCounts) DroppedTotal() int {
	n := 0
	for _, v := range c.Dropped {
		n += v
	}
	return n
}

// Replay is a flat-wire request's history: one string and one image list.
type Replay struct {
	History string
	Images  []Attached
	Counts  ReplayCounts
	// NotAttached names the current message's images not attached (no
	// vision, or a URL that could not be fetched), one note each, for the
	// prompt beside the message's text; each is counted in Counts.
	NotAttached []string
}

type candidate struct {
	turn    int
	img     chat.Image
	doc     bool
	why     reason.Code
	ordinal int
}

// BuildReplay renders history for a wire that has one history string and one
// flat list of images (seed replayed-history-images): the current message's
// images keep positions 1..k, history images follow in chronological order,
// and each replayed turn's text carries a numbered marker naming the ordinal
// of its image. Caps apply newest turn first; drops are counted by reason
// (cap, bytes, truncated, no_vision, document, fetch_failed) and, when there
// are any, reported in one structured log line. Fresh and rebuilt (resumed)
// requests use this same builder, once per request.
func BuildReplay(ctx context.Context, history []chat.Message, current chat.Message, cfg ReplayConfig, res Resolver, log *slog.Logger) (Replay, error) {
	turns := splitTurns(history)
	counts := ReplayCounts{Turns: len(turns), Dropped: map[reason.Code]int{}}
	var out Replay
	for _, img := range current.Images() {
		why := reason.Code("")
		if !cfg.Vision {
			// A backend that renders no images gets none, the current
			// message's included.
			why = reason.NoVision
		} else if resolved, err := res.Resolve(ctx, img); err != nil {
			// A URL that cannot be fetched safely (the current message's
			// images by URL are fetched now, through the resolver).
			if ctx.Err() != nil {
				return Replay{}, ctx.Err()
			}
			why = reason.FetchFailed
		} else {
			img = resolved
		}
		if why != "" {
			// Named where it stood, and counted.
			out.NotAttached = append(out.NotAttached, notAttached(img, why, cfg.handle(img, why)))
			counts.Candidates++
			counts.Dropped[why]++
			continue
		}
		out.Images = append(out.Images, Attached{Ordinal: len(out.Images) + 1, Image: img, Turn: -1})
	}
	k := len(out.Images)

	first := firstReplayed(history, turns, cfg.MaxHistoryChars) // older turns are truncated
	// Candidates in walk order; renderHistory walks the same order.
	var cands []candidate
	for ti, turn := range turns {
		for _, mi := range turn {
			chat.Walk(history[mi].Parts, func(p chat.Part, _ int) bool {
				switch p := p.(type) {
				case chat.Image:
					cands = append(cands, candidate{turn: ti, img: p})
				case chat.Document:
					cands = append(cands, candidate{turn: ti, doc: true, why: reason.Document})
				}
				return true
			})
		}
	}
	counts.Candidates += len(cands)
	for i := range cands {
		c := &cands[i]
		switch {
		case c.doc:
		case c.turn < first:
			c.why = reason.Truncated
		case !cfg.Vision:
			c.why = reason.NoVision
		}
	}
	// Newest turn wins: walk the candidates backwards, filling the caps.
	used, usedBytes := 0, int64(0)
	for i := len(cands) - 1; i >= 0; i-- {
		c := &cands[i]
		if c.why != "" {
			continue
		}
		if used >= cfg.MaxHistoryImages || usedBytes >= cfg.MaxHistoryImageBytes {
			c.why = reason.Cap
			if used < cfg.MaxHistoryImages {
				c.why = reason.Bytes
			}
			continue // caps exhausted: never fetched
		}
		img, err := res.Resolve(ctx, c.img)
		if err != nil {
			if ctx.Err() != nil {
				return Replay{}, ctx.Err()
			}
			c.why = reason.FetchFailed
			continue
		}
		if usedBytes+img.Bytes > cfg.MaxHistoryImageBytes {
			c.why = reason.Bytes
			continue
		}
		c.img = img
		used++
		usedBytes += img.Bytes
	}
	for i := range cands { // chronological numbering after the current images
		c := &cands[i]
		if c.why == "" {
			k++
			c.ordinal = k
			out.Images = append(out.Images, Attached{Ordinal: k, Image: c.img, Turn: c.turn})
			counts.Attached++
		} else {
			counts.Dropped[c.why]++
		}
	}
	out.History = renderHistory(history, turns, first, cands, cfg)
	out.Counts = counts
	if d := counts.DroppedTotal(); d > 0 && log != nil {
		log.Info("flat replay: images not attached",
			"count", d, "cap", counts.Dropped[reason.Cap], "bytes", counts.Dropped[reason.Bytes],
			"truncated", counts.Dropped[reason.Truncated], "no_vision", counts.Dropped[reason.NoVision],
			"document", counts.Dropped[reason.Document], "fetch_failed", counts.Dropped[reason.FetchFailed],
			"turns", counts.Turns, "attached", counts.Attached,
			"why", "the backend takes one flat image list (or none, without vision): these are named in the prompt instead")
	}
	return out, nil
}

// splitTurns groups message indexes into turns, each starting at a user
// message; system messages are not part of any turn.
func splitTurns(msgs []chat.Message) [][]int {
	var turns [][]int
	for i, m := range msgs {
		switch {
		case m.Role == chat.System:
		case m.Role == chat.User || len(turns) == 0:
			turns = append(turns, []int{i})
		default:
			turns[len(turns)-1] = append(turns[len(turns)-1], i)
		}
	}
	return turns
}

// firstReplayed returns the index of the oldest turn that still fits the
// text budget, counting text from the newest turn back. Markers are wrapper
// text and do not count; budget 0 means no budget.
func firstReplayed(msgs []chat.Message, turns [][]int, budget int) int {
	if budget <= 0 {
		return 0
	}
	used := 0
	for ti := len(turns) - 1; ti >= 0; ti-- {
		for _, mi := range turns[ti] {
			used += textChars(msgs[mi].Parts)
		}
		if used > budget {
			return ti + 1
		}
	}
	return 0
}

func textChars(parts []chat.Part) int {
	n := 0
	chat.Walk(parts, func(p chat.Part, _ int) bool {
		switch p := p.(type) {
		case chat.Text:
			n += len(p.Text)
		case chat.ToolCall:
			n += len(p.Name) + len(p.Arguments)
		case chat.Summary:
			n += len(p.Text)
		case chat.Document:
			n += len(p.Text)
		}
		return true
	})
	return n
}

func renderHistory(msgs []chat.Message, turns [][]int, first int, cands []candidate, cfg ReplayConfig) string {
	var b strings.Builder
	b.Grow(4096)
	if first > 0 {
		b.WriteString("[" + strconv.Itoa(first) + " earlier turn(s) omitted]\n")
	}
	next := 0 // candidates come in the order this walk meets media
	for ti, turn := range turns {
		for _, mi := range turn {
			if ti < first {
				next += countMedia(msgs[mi].Parts)
				continue
			}
			b.WriteString(roleLabel(msgs[mi].Role))
			b.WriteString(": ")
			chat.Walk(msgs[mi].Parts, func(p chat.Part, _ int) bool {
				switch p := p.(type) {
				case chat.Text:
					b.WriteString(p.Text)
				case chat.ToolCall:
					b.WriteString("[call " + p.Name + " " + p.Arguments + "]")
				case chat.ToolResult:
					b.WriteString("[result of " + p.Name + "]")
				case chat.Summary:
					b.WriteString(p.Text)
				case chat.Marker:
					b.WriteString(p.String())
				case chat.Document:
					next++
					b.WriteString(placeholder("document", p.MediaType, p.Caption))
					if p.Text != "" {
						b.WriteString("\n" + p.Text)
					}
				case chat.Image:
					c := cands[next]
					next++
					if c.ordinal > 0 {
						b.WriteString("[Image #" + strconv.Itoa(c.ordinal) + " attached to this request — from an earlier turn]")
					} else {
						b.WriteString(notAttached(p, c.why, cfg.handle(c.img, c.why)))
					}
				}
				b.WriteByte(' ')
				return true
			})
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func countMedia(parts []chat.Part) int {
	n := 0
	chat.Walk(parts, func(p chat.Part, _ int) bool {
		switch p.(type) {
		case chat.Image, chat.Document:
			n++
		}
		return true
	})
	return n
}

func notAttached(img chat.Image, why reason.Code, handle string) string {
	s := "[Image not attached: " + mimetype.Sanitize(img.MediaType)
	if img.Caption != "" {
		s += " — " + img.Caption
	}
	s += " (" + string(why) + ")"
	if handle != "" {
		s += " — recall with " + chat.RecallTool + `("` + handle + `")`
	}
	return s + "]"
}

func (c ReplayConfig) handle(img chat.Image, why reason.Code) string {
	if c.Handle == nil || !img.Ref.Valid() {
		return ""
	}
	return c.Handle(img, why)
}

func roleLabel(r chat.Role) string {
	switch r {
	case chat.User:
		return "User"
	case chat.Assistant:
		return "Assistant"
	case chat.Tool:
		return "Tool"
	}
	return string(r)
}
