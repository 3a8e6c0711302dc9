// Package policy decides, without doing any I/O, what each request carries:
// which tool images are kept across turns and at what measured cost
// (KeepTurn), which kept images leave first when the window fills
// (EvictImages), how a prefix is summarised (Slim, SplitPoint, Compact), what
// an idle session clears (Microcompact), how history images ride a flat-list
// wire (BuildReplay), and which images would break a provider rule
// (CheckProviderRules).
//
// What a policy needs from outside — a store, a summariser, a fetcher, a
// shrinker — it declares as a small interface. Every function leaves its
// input untouched and returns the same slice when nothing changes; every
// image it stops sending is reported with a reason code.
package policy

import (
	"slices"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
)

// Removal is an image or document that is no longer sent, and why.
type Removal struct {
	Ref     blob.Ref
	Of      string // "image" or "document"
	Reason  reason.Code
	Message int // index of the message it was in
	Cost    int // tokens it stops costing (measured, else estimated), when known
}

// edit rewrites the parts of msgs, nested tool-result parts included. fn
// sees each part with the index of its message and its depth (0 top level)
// and returns the parts to put in its place (nil to drop it) and whether it
// changed anything. Messages and part slices are copied only where
// something changed, so msgs is never modified and comes back as the very
// same slice when nothing did.
func edit(msgs []chat.Message, fn func(msg int, p chat.Part, depth int) ([]chat.Part, bool)) []chat.Message {
	var out []chat.Message
	for i := range msgs {
		out = editAt(out, msgs, i, fn)
	}
	if out == nil {
		return msgs
	}
	return out
}

// editImages is edit for the images of msgs alone: fn sees each image with
// the index of its message, and a message that holds none is not walked
// (most of a long agent history is text).
func editImages(msgs []chat.Message, fn func(msg int, img chat.Image) ([]chat.Part, bool)) []chat.Message {
	var out []chat.Message
	for _, i := range chat.Imaged(msgs) {
		out = editAt(out, msgs, i, func(i int, p chat.Part, _ int) ([]chat.Part, bool) {
			if img, ok := p.(chat.Image); ok {
				return fn(i, img)
			}
			return nil, false
		})
	}
	if out == nil {
		return msgs
	}
	return out
}

// eachImage calls fn with every image of msgs, nested ones included, in
// order, and the index of its message; a message that holds none is not
// walked.
func eachImage(msgs []chat.Message, fn func(msg int, img chat.Image)) {
	for _, i := range chat.Imaged(msgs) {
		chat.Walk(msgs[i].Parts, func(p chat.Part, _ int) bool {
			if img, ok := p.(chat.Image); ok {
				fn(i, img)
			}
			return true
		})
	}
}

// editAt edits msgs[i] with fn into out, a copy of msgs made at the first
// change (nil until then), and returns out.
func editAt(out, msgs []chat.Message, i int, fn func(msg int, p chat.Part, depth int) ([]chat.Part, bool)) []chat.Message {
	parts, changed := editParts(msgs[i].Parts, func(p chat.Part, depth int) ([]chat.Part, bool) { return fn(i, p, depth) }, 0)
	if !changed {
		return out
	}
	if out == nil {
		out = slices.Clone(msgs)
	}
	out[i].Parts = parts
	return out
}

func editParts(parts []chat.Part, fn func(chat.Part, int) ([]chat.Part, bool), depth int) ([]chat.Part, bool) {
	var out []chat.Part
	for i, p := range parts {
		repl, changed := fn(p, depth)
		if !changed {
			if tr, ok := p.(chat.ToolResult); ok {
				if nested, ch := editParts(tr.Parts, fn, depth+1); ch {
					tr.Parts = nested
					repl, changed = []chat.Part{tr}, true
				}
			}
		}
		if changed && out == nil {
			out = make([]chat.Part, i, len(parts))
			copy(out, parts[:i])
		}
		if out != nil {
			if changed {
				out = append(out, repl...)
			} else {
				out = append(out, p)
			}
		}
	}
	if out == nil {
		return parts, false
	}
	return out, true
}

// markerFor replaces an image or document by its marker.
func markerFor(p chat.Part, why reason.Code) []chat.Part {
	m, _ := chat.MarkerFor(p, string(why))
	return []chat.Part{m}
}
