package openai

import (
	"fmt"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Wire names this format in chat.Opaque parts and message tags.
const Wire = "openai"

// Scan reads a /v1/chat/completions body in place (see wire.Spliced):
// image_url parts and file parts carrying file_data are slots, in any
// message (a tool message's content included); every other part, role and
// field stays as it came.
//
// o may give the conversation's previous scan, a hook for each slot, and
// limits (see wire.ScanOptions).
func Scan(body []byte, o wire.ScanOptions) (*wire.Spliced, error) {
	return wire.ScanRequest(body, o, scanMessages, "model", "stream", "stream_options", "messages")
}

func scanMessages(s *wire.Spliced, at int) (int, error) {
	b := s.Body
	return wire.WalkMessages(s, at, func(vs int) (int, error) {
		i := len(s.Messages)
		if b[vs] != '{' {
			return vs, fmt.Errorf("messages[%d]: not an object", i)
		}
		m := chat.Message{Wire: Wire}
		firstSlot := len(s.Slots)
		var callID string
		keys := wire.NewKeys("role", "content", "tool_call_id")
		end, err := jsonspan.Object(b, vs, func(key []byte, ks int) (int, error) {
			if err := keys.Check(key); err != nil {
				return ks, err
			}
			switch string(key) {
			case "content":
				parts, ke, err := scanContent(s, ks, wire.Pos{Msg: i, Nested: -1})
				m.Parts = parts
				return ke, err
			case "role", "tool_call_id":
				ke, err := jsonspan.End(b, ks)
				v, _ := jsonspan.String(b, ks, ke)
				if string(key) == "tool_call_id" {
					callID = v
				} else if m.Role = chat.Role(v); v == "developer" {
					m.Role = chat.System
				}
				return ke, err
			}
			return jsonspan.End(b, ks)
		})
		if err != nil {
			return end, fmt.Errorf("messages[%d]: %w", i, err)
		}
		if m.Role == chat.Tool && m.Parts != nil {
			// A tool message's content is its result: the slots move inside.
			m.Parts = []chat.Part{chat.ToolResult{CallID: callID, Parts: m.Parts}}
			for k := firstSlot; k < len(s.Slots); k++ {
				s.Slots[k].Pos = wire.Pos{Msg: i, Part: 0, Nested: s.Slots[k].Pos.Part}
			}
		}
		s.Messages = append(s.Messages, m)
		return end, nil
	})
}

// scanContent reads a message's content (wire.ScanParts): a part per
// element, read by scanPart.
func scanContent(s *wire.Spliced, at int, pos wire.Pos) ([]chat.Part, int, error) {
	return wire.ScanParts(s, at, pos, "content", chat.Opaque{Wire: Wire}, func(vs int, p wire.Pos) (chat.Part, int, error) { return scanPart(s, vs, p) })
}

// scanPart reads the part at b[at] in one pass: an image_url or file
// member is read where it stands and kept once the type says so.
func scanPart(s *wire.Spliced, at int, pos wire.Pos) (chat.Part, int, error) {
	b := s.Body
	if b[at] != '{' {
		end, err := jsonspan.End(b, at)
		return chat.Opaque{Wire: Wire}, end, err
	}
	var typ wire.Span
	var img, file wire.Slot
	var isImg, isFile bool
	keys := wire.NewKeys("type", "image_url", "file")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		var ve int
		var err error
		switch string(key) {
		case "image_url":
			if b[vs] == '"' {
				// The URL as a string, which vLLM and other OpenAI-compatible
				// servers read too: managed like the object form.
				ve, err = jsonspan.EndBase64(b, vs)
				if err == nil {
					img, isImg, err = wire.URLSlot(b, wire.Span{Start: vs, End: ve})
				}
				break
			}
			img, isImg, ve, err = urlSlot(b, vs, "url")
		case "file":
			file, isFile, ve, err = urlSlot(b, vs, "file_data")
		default:
			ve, err = jsonspan.End(b, vs)
			if string(key) == "type" {
				typ = wire.Span{Start: vs, End: ve}
			}
		}
		return ve, err
	})
	if err != nil {
		return nil, end, err
	}
	sp := wire.Span{Start: at, End: end}
	slot, ok := wire.Slot{}, false
	switch t, _ := jsonspan.String(b, typ.Start, typ.End); t {
	case "image_url", "input_image", "":
		// input_image and a part with no type but an image_url are images
		// to the servers that read them (vLLM): managed, never forwarded
		// unchecked.
		slot, ok = img, isImg
		slot.Kind = "image"
	case "file":
		slot, ok = file, isFile && file.Via != "url" // file data inline or by ref; a file_id is the provider's own
		slot.Kind = "document"
	}
	// Base64 read in passing that is not the slot (a part carrying both
	// members) goes upstream as it came: it gets the check decoding would
	// have given it.
	for _, u := range []wire.Slot{img, file} {
		if u.Via == "base64" && (!ok || u.Source != slot.Source) {
			if err := jsonspan.Check(b, u.Source.Start, u.Source.End); err != nil {
				return nil, end, err
			}
		}
	}
	if !ok {
		return chat.Opaque{Wire: Wire}, end, nil
	}
	slot.Pos, slot.Part = pos, sp
	s.Add(slot)
	if slot.Kind == "document" {
		return chat.Document{}, end, nil
	}
	return chat.Image{}, end, nil
}

// urlSlot reads the object at b[at] for its URL-valued member key
// (image_url's url, file's file_data) and detail.
func urlSlot(b []byte, at int, key string) (slot wire.Slot, ok bool, end int, err error) {
	if b[at] != '{' {
		end, err = jsonspan.End(b, at)
		return wire.Slot{}, false, end, err
	}
	var u, detail wire.Span
	keys := wire.NewKeys(key, "detail")
	end, err = jsonspan.Object(b, at, func(k []byte, vs int) (int, error) {
		if err := keys.Check(k); err != nil {
			return vs, err
		}
		if string(k) == key {
			ve, err := jsonspan.EndBase64(b, vs)
			u = wire.Span{Start: vs, End: ve}
			return ve, err
		}
		ve, err := jsonspan.End(b, vs)
		if string(k) == "detail" {
			detail = wire.Span{Start: vs, End: ve}
		}
		return ve, err
	})
	if err != nil || u.End == 0 {
		return wire.Slot{}, false, end, err
	}
	slot, ok, err = wire.URLSlot(b, u)
	if !ok || err != nil {
		return wire.Slot{}, false, end, err
	}
	slot.Detail, _ = jsonspan.String(b, detail.Start, detail.End)
	return slot, true, end, nil
}

// WriteText writes a text part.
func WriteText(w *wire.BodyWriter, text string) {
	w.WriteString(`{"type":"text","text":`)
	w.Write(wire.Quote(text))
	w.WriteByte('}')
}
