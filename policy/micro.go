package policy

import (
	"slices"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/mimetype"
	"github.com/imgctx/imgctx/reason"
)

// ToolSentinel replaces the output of a cleared tool result.
const ToolSentinel = "[Old tool result content cleared]"

// MicroConfig tunes microcompaction. Start from DefaultMicro: KeepRecent
// values are taken literally (0 keeps none).
type MicroConfig struct {
	// IdleAfter is how long a session must have been idle; by then the
	// provider's prompt cache is cold and clearing costs nothing extra.
	// Zero means 60 minutes.
	IdleAfter time.Duration
	// KeepRecent is how many of the most recent items of each category stay.
	KeepRecent MicroKeep
	// CompactableTools are the tools whose results are cleared whole.
	CompactableTools []string
	// Off turns microcompaction off.
	Off bool
	// MaxToolBytes, when positive, is a size trigger: once the results of
	// compactable tools before the turn hold more text than this, the
	// oldest are cleared (keep_recent still holds) down to half of it,
	// idle or not.
	MaxToolBytes int
}

// MicroKeep holds one keep_recent per category: 1 keeps one tool result,
// one inline medium and one tool result with nested media, not one item in
// total.
type MicroKeep struct {
	Tool        int
	Media       int
	NestedMedia int
}

// DefaultMicro returns the defaults: idle after 60 minutes, keep the most
// recent item of each category, and the usual read-only tools compactable.
func DefaultMicro() MicroConfig {
	return MicroConfig{
		IdleAfter:        60 * time.Minute,
		KeepRecent:       MicroKeep{Tool: 1, Media: 1, NestedMedia: 1},
		CompactableTools: []string{"read_file", "read_many_files", "grep", "glob", "ls", "shell", "web_fetch", "web_search"},
	}
}

// MicroStats counts what a microcompaction cleared.
type MicroStats struct {
	Tool        int
	Media       int
	NestedMedia int
	Removed     []Removal // every image and document no longer sent, reason idle
}

type microItem struct {
	msg, part int
	kind      int // 0 tool, 1 media, 2 nested media
}

// Microcompact clears stale content once the session has been idle for
// cfg.IdleAfter: results of compactable tools are replaced whole by
// ToolSentinel (nested parts included); images and documents at the top of
// user messages become "[Old inline media cleared: <mime>]"; media inside
// results of other tools is cleared the same way while the tool's text
// stays. The most recent KeepRecent items of each category stay, and
// messages from currentTurn on (the turn in progress) are never touched.
// msgs is not modified; it comes back as is when nothing is cleared.
//
// Error results are never cleared (the model needs to know what failed),
// and empty or already-cleared results take no keep slot. With
// MaxToolBytes set, a history whose compactable results pass that size is
// cleared of its oldest ones down to half of it even before the idle time.
func Microcompact(msgs []chat.Message, idle time.Duration, currentTurn int, cfg MicroConfig) ([]chat.Message, MicroStats) {
	var st MicroStats
	if cfg.Off {
		return msgs, st
	}
	after := cfg.IdleAfter
	if after <= 0 {
		after = 60 * time.Minute
	}
	var items []microItem
	size := map[microItem]int{} // text bytes of each compactable result
	total := 0
	for i, m := range msgs[:min(currentTurn, len(msgs))] {
		for j, p := range m.Parts {
			switch p := p.(type) {
			case chat.ToolResult:
				if p.IsError {
					continue
				}
				if p.Name != "" && slices.Contains(cfg.CompactableTools, p.Name) {
					if n := textBytes(p.Parts); !cleared(p) && (n > 0 || hasMedia(p.Parts)) {
						it := microItem{i, j, 0}
						items = append(items, it)
						size[it] = n
						total += n
					}
				} else if hasMedia(p.Parts) {
					items = append(items, microItem{i, j, 2})
				}
			case chat.Image, chat.Document:
				if m.Role == chat.User {
					items = append(items, microItem{i, j, 1})
				}
			}
		}
	}
	bySize := cfg.MaxToolBytes > 0 && total > cfg.MaxToolBytes
	if idle < after && !bySize {
		return msgs, st
	}
	keep := [3]int{cfg.KeepRecent.Tool, cfg.KeepRecent.Media, cfg.KeepRecent.NestedMedia}
	var seen [3]int
	clearable := map[microItem]bool{} // the oldest items beyond keep_recent
	for k := len(items) - 1; k >= 0; k-- {
		it := items[k]
		seen[it.kind]++
		if seen[it.kind] > keep[it.kind] {
			clearable[it] = true
		}
	}
	clear := map[[2]int]int{}  // (msg, part) → kind
	for _, it := range items { // oldest first
		if !clearable[it] {
			continue
		}
		if idle < after { // the size trigger alone: tool results, down to half
			if it.kind != 0 || total <= cfg.MaxToolBytes/2 {
				continue
			}
			total -= size[it]
		}
		clear[[2]int{it.msg, it.part}] = it.kind
	}
	if len(clear) == 0 {
		return msgs, st
	}
	out := slices.Clone(msgs)
	for i := range out {
		var parts []chat.Part
		for j, p := range msgs[i].Parts {
			kind, ok := clear[[2]int{i, j}]
			if !ok {
				continue
			}
			if parts == nil {
				parts = slices.Clone(msgs[i].Parts)
			}
			switch kind {
			case 0:
				tr := p.(chat.ToolResult)
				st.Tool++
				st.Removed = append(st.Removed, mediaRemovals(tr.Parts, i)...)
				tr.Parts = []chat.Part{chat.Text{Text: ToolSentinel}}
				parts[j] = tr
			case 1:
				st.Media++
				st.Removed = append(st.Removed, mediaRemovals([]chat.Part{p}, i)...)
				parts[j] = clearedMedia(p)
			case 2:
				tr := p.(chat.ToolResult)
				st.NestedMedia++
				st.Removed = append(st.Removed, mediaRemovals(tr.Parts, i)...)
				nested := make([]chat.Part, len(tr.Parts))
				for n, q := range tr.Parts {
					nested[n] = clearedMedia(q)
				}
				tr.Parts = nested
				parts[j] = tr
			}
		}
		if parts != nil {
			out[i].Parts = parts
		}
	}
	return out, st
}

func textBytes(parts []chat.Part) int {
	n := 0
	for _, p := range parts {
		if t, ok := p.(chat.Text); ok {
			n += len(t.Text)
		}
	}
	return n
}

func cleared(tr chat.ToolResult) bool {
	return len(tr.Parts) == 1 && tr.Parts[0] == chat.Part(chat.Text{Text: ToolSentinel})
}

func hasMedia(parts []chat.Part) bool {
	for _, p := range parts {
		switch p.(type) {
		case chat.Image, chat.Document:
			return true
		}
	}
	return false
}

// clearedMedia turns an image or document into its idle placeholder and
// leaves any other part as it is.
func clearedMedia(p chat.Part) chat.Part {
	switch p := p.(type) {
	case chat.Image:
		return chat.Text{Text: idlePlaceholder(p.MediaType, p.Caption)}
	case chat.Document:
		return chat.Text{Text: idlePlaceholder(p.MediaType, p.Caption)}
	}
	return p
}

func idlePlaceholder(mediaType, caption string) string {
	s := "[Old inline media cleared: " + mimetype.Sanitize(mediaType)
	if caption != "" {
		s += " — " + caption
	}
	return s + "]"
}

func mediaRemovals(parts []chat.Part, msg int) []Removal {
	var out []Removal
	chat.Walk(parts, func(p chat.Part, _ int) bool {
		switch p := p.(type) {
		case chat.Image:
			out = append(out, Removal{Ref: p.Ref, Of: "image", Reason: reason.Idle, Message: msg, Cost: p.Cost})
		case chat.Document:
			out = append(out, Removal{Ref: p.Ref, Of: "document", Reason: reason.Idle, Message: msg})
		}
		return true
	})
	return out
}
