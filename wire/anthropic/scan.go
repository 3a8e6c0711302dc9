package anthropic

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Wire names this format in chat.Opaque parts and message tags.
const Wire = "anthropic"

// Scan reads a /v1/messages body in place (see wire.Spliced): image blocks
// with a base64 or url source and base64 PDF document blocks are slots, at
// the top level of a message or inside a tool_result's content; every other
// block, the system prompt and every field stay as they came.
//
// o may give the conversation's previous scan, a hook for each slot, and
// limits (see wire.ScanOptions).
func Scan(body []byte, o wire.ScanOptions) (*wire.Spliced, error) {
	return wire.ScanRequest(body, o, scanMessages, "model", "stream", "system", "messages")
}

func scanMessages(s *wire.Spliced, at int) (int, error) {
	b := s.Body
	return wire.WalkMessages(s, at, func(vs int) (int, error) {
		i := len(s.Messages)
		if b[vs] != '{' {
			return vs, fmt.Errorf("messages[%d]: not an object", i)
		}
		s.Messages = append(s.Messages, chat.Message{Wire: Wire})
		keys := wire.NewKeys("role", "content")
		return jsonspan.Object(b, vs, func(key []byte, ks int) (int, error) {
			if err := keys.Check(key); err != nil {
				return ks, err
			}
			switch string(key) {
			case "role":
				ke, err := jsonspan.End(b, ks)
				r, _ := jsonspan.String(b, ks, ke)
				s.Messages[i].Role = chat.Role(r) // user, assistant, system: as the wire says
				return ke, err
			case "content":
				parts, ke, err := scanContent(s, ks, wire.Pos{Msg: i, Nested: -1})
				if err != nil {
					return ke, fmt.Errorf("messages[%d]: %w", i, err)
				}
				s.Messages[i].Parts = parts
				return ke, nil
			}
			return jsonspan.End(b, ks)
		})
	})
}

// scanContent reads a message's or a tool result's content (wire.ScanParts):
// a part per block, read by scanBlock.
func scanContent(s *wire.Spliced, at int, pos wire.Pos) ([]chat.Part, int, error) {
	return wire.ScanParts(s, at, pos, "content", chat.Opaque{Wire: Wire}, func(vs int, p wire.Pos) (chat.Part, int, error) { return scanBlock(s, vs, p) })
}

// scanBlock reads the block at b[at] in one pass: its source and content
// are read where they stand (the type may come after them) and kept or
// dropped once the type is known.
func scanBlock(s *wire.Spliced, at int, pos wire.Pos) (chat.Part, int, error) {
	b := s.Body
	if b[at] != '{' {
		end, err := jsonspan.End(b, at)
		return chat.Opaque{Wire: Wire}, end, err
	}
	var typ, toolUseID, cache wire.Span
	var slot wire.Slot
	var sourced bool
	var nested []chat.Part
	slots := len(s.Slots)
	keys := wire.NewKeys("type", "source", "content", "tool_use_id", "cache_control")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		switch string(key) {
		case "source":
			var ve int
			var err error
			slot, sourced, ve, err = scanSource(b, vs)
			return ve, err
		case "content":
			if pos.Nested >= 0 || b[vs] != '[' {
				break // only a top-level tool_result's content is read
			}
			parts, ve, err := scanContent(s, vs, wire.Pos{Msg: pos.Msg, Part: pos.Part, Nested: 0})
			nested = parts
			return ve, err
		}
		ve, err := jsonspan.End(b, vs)
		switch sp := (wire.Span{Start: vs, End: ve}); string(key) {
		case "type":
			typ = sp
		case "tool_use_id":
			toolUseID = sp
		case "cache_control":
			cache = sp
		}
		return ve, err
	})
	if err != nil {
		return nil, end, err
	}
	blk := wire.Span{Start: at, End: end}
	opaque := chat.Opaque{Wire: Wire}
	t, _ := jsonspan.String(b, typ.Start, typ.End)
	if t == "compaction" && pos.Nested < 0 {
		s.Compaction()
	}
	if t != "tool_result" {
		// A content list of another block type is the provider's: its
		// images are not slots, and their base64 (skipped, for decoding to
		// check) gets its check now.
		for _, sl := range s.Slots[slots:] {
			if err := jsonspan.Check(b, sl.Source.Start, sl.Source.End); err != nil {
				return nil, end, err
			}
		}
		s.Slots = s.Slots[:slots]
	}
	if sourced && slot.Via == "base64" && t != "image" && t != "document" {
		// Not a slot: its base64 gets the check decoding would have given.
		if err := jsonspan.Check(b, slot.Source.Start, slot.Source.End); err != nil {
			return nil, end, err
		}
	}
	switch t {
	case "image", "document":
		if !sourced || t == "document" && slot.Via == "url" {
			return opaque, end, nil // a file id, a text or content source: the provider's, untouched
		}
		slot.Kind, slot.Pos, slot.Part = t, pos, blk
		if cache.End > 0 {
			slot.Cache = cache
		}
		s.Add(slot)
		if t == "document" {
			return chat.Document{}, end, nil
		}
		return chat.Image{}, end, nil
	case "tool_result":
		if nested == nil {
			return opaque, end, nil
		}
		id, _ := jsonspan.String(b, toolUseID.Start, toolUseID.End)
		return chat.ToolResult{CallID: id, Parts: nested}, end, nil
	}
	return opaque, end, nil
}

// scanSource reads the source object at b[at]: base64 data (or an imgctx:
// ref in its place), or a url (http(s) or imgctx:). ok is false for any
// other source (a file id, text, a content list).
func scanSource(b []byte, at int) (slot wire.Slot, ok bool, end int, err error) {
	if b[at] != '{' {
		end, err = jsonspan.End(b, at)
		return wire.Slot{}, false, end, err
	}
	var typ, mt, data, url wire.Span
	keys := wire.NewKeys("type", "media_type", "data", "url")
	end, err = jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		if string(key) == "data" {
			ve, err := jsonspan.EndBase64(b, vs)
			data = wire.Span{Start: vs, End: ve}
			return ve, err
		}
		ve, err := jsonspan.End(b, vs)
		sp := wire.Span{Start: vs, End: ve}
		switch string(key) {
		case "type":
			typ = sp
		case "media_type":
			mt = sp
		case "url":
			url = sp
		}
		return ve, err
	})
	if err != nil {
		return wire.Slot{}, false, end, err
	}
	t, _ := jsonspan.String(b, typ.Start, typ.End)
	if data.End > 0 && (t != "base64" || bytes.HasPrefix(b[data.Start:min(data.End, data.Start+8)], []byte(`"imgctx:`))) {
		// Not base64 after all: its bytes get the check decoding would give.
		if err := jsonspan.Check(b, data.Start, data.End); err != nil {
			return wire.Slot{}, false, end, err
		}
	}
	slot = wire.Slot{Source: wire.Span{Start: at, End: end}}
	slot.MediaType, _ = jsonspan.String(b, mt.Start, mt.End)
	switch t {
	case "base64":
		if data.End-data.Start < 2 || b[data.Start] != '"' {
			return wire.Slot{}, false, end, nil
		}
		if bytes.HasPrefix(b[data.Start:min(data.End, data.Start+8)], []byte(`"imgctx:`)) {
			ref, ok := jsonspan.String(b, data.Start, data.End)
			if !ok {
				return wire.Slot{}, false, end, fmt.Errorf("invalid JSON string at byte %d", data.Start)
			}
			slot.Via, slot.URL = "ref", ref
			return slot, true, end, nil
		}
		// Megabytes, used as they stand: the decoder undoes any escape.
		slot.Via, slot.Data = "base64", wire.Span{Start: data.Start + 1, End: data.End - 1}
		return slot, true, end, nil
	case "url":
		u, ok := jsonspan.String(b, url.Start, url.End)
		if !ok {
			return wire.Slot{}, false, end, fmt.Errorf("invalid JSON string at byte %d", url.Start)
		}
		slot.Via, slot.URL = "url", u
		if strings.HasPrefix(u, "imgctx:") {
			slot.Via = "ref"
		}
		return slot, true, end, nil
	}
	return wire.Slot{}, false, end, nil
}

// WriteSource writes a base64 source object for a stored image or
// document (the base64 as it is, a piece of its own).
func WriteSource(w *wire.BodyWriter, mediaType, b64 string) {
	w.WriteString(`{"type":"base64","media_type":`)
	w.Write(wire.Quote(mediaType))
	w.WriteString(`,"data":`)
	wire.WriteBase64(w, b64)
	w.WriteByte('}')
}

// WriteText writes a text block, with the client's cache_control when the
// block it replaces had one.
func WriteText(w *wire.BodyWriter, text string, cache []byte) {
	w.WriteString(`{"type":"text","text":`)
	w.Write(wire.Quote(text))
	if len(cache) > 0 {
		w.WriteString(`,"cache_control":`)
		w.Write(cache)
	}
	w.WriteByte('}')
}
