package anthropic

import (
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
func Scan(body []byte) (*wire.Spliced, error) {
	s := &wire.Spliced{Body: body, Top: map[string]wire.Span{}}
	start := jsonspan.Skip(body, 0)
	end, err := jsonspan.Object(body, start, func(key []byte, vs, ve int) error {
		s.Top[string(key)] = wire.Span{Start: vs, End: ve}
		switch string(key) {
		case "model":
			s.Model, _ = jsonspan.String(body, vs, ve)
		case "stream":
			s.Stream = string(body[vs:ve]) == "true"
		case "messages":
			return scanMessages(s, vs)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if jsonspan.Skip(body, end) != len(body) {
		return nil, fmt.Errorf("request body: trailing data after the JSON object")
	}
	if _, ok := s.Top["messages"]; !ok {
		return nil, fmt.Errorf("request has no messages")
	}
	s.End = end - 1
	return s, nil
}

func scanMessages(s *wire.Spliced, at int) error {
	b := s.Body
	if b[at] != '[' {
		return fmt.Errorf("messages: not an array")
	}
	_, err := jsonspan.Array(b, at, func(vs, ve int) error {
		i := len(s.Messages)
		if b[vs] != '{' {
			return fmt.Errorf("messages[%d]: not an object", i)
		}
		m := chat.Message{Wire: Wire}
		var content wire.Span
		_, err := jsonspan.Object(b, vs, func(key []byte, ks, ke int) error {
			switch string(key) {
			case "role":
				r, _ := jsonspan.String(b, ks, ke)
				m.Role = chat.Role(r) // user, assistant, system: as the wire says
			case "content":
				content = wire.Span{Start: ks, End: ke}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.Messages = append(s.Messages, m)
		if content.End > 0 {
			parts, err := scanContent(s, content, wire.Pos{Msg: i, Nested: -1})
			if err != nil {
				return fmt.Errorf("messages[%d]: %w", i, err)
			}
			s.Messages[i].Parts = parts
		}
		return nil
	})
	return err
}

// scanContent reads a content value: a string is one opaque part; an array
// gives a part per block. pos is the position of the first part (its Part
// or Nested index grows with each block).
func scanContent(s *wire.Spliced, c wire.Span, pos wire.Pos) ([]chat.Part, error) {
	b := s.Body
	if b[c.Start] != '[' {
		return []chat.Part{chat.Opaque{Wire: Wire, Raw: s.Text(c)}}, nil
	}
	var parts []chat.Part
	_, err := jsonspan.Array(b, c.Start, func(vs, ve int) error {
		p := pos
		if p.Nested >= 0 {
			p.Nested = len(parts)
		} else {
			p.Part = len(parts)
		}
		part, err := scanBlock(s, wire.Span{Start: vs, End: ve}, p)
		if err != nil {
			return fmt.Errorf("content[%d]: %w", len(parts), err)
		}
		parts = append(parts, part)
		return nil
	})
	return parts, err
}

// blockSpans are the members of a block imgctx looks at.
type blockSpans struct {
	typ, source, content, toolUseID, cache wire.Span
}

func scanBlock(s *wire.Spliced, blk wire.Span, pos wire.Pos) (chat.Part, error) {
	b := s.Body
	opaque := chat.Opaque{Wire: Wire, Raw: s.Text(blk)}
	if b[blk.Start] != '{' {
		return opaque, nil
	}
	var f blockSpans
	if _, err := jsonspan.Object(b, blk.Start, func(key []byte, vs, ve int) error {
		sp := wire.Span{Start: vs, End: ve}
		switch string(key) {
		case "type":
			f.typ = sp
		case "source":
			f.source = sp
		case "content":
			f.content = sp
		case "tool_use_id":
			f.toolUseID = sp
		case "cache_control":
			f.cache = sp
		}
		return nil
	}); err != nil {
		return nil, err
	}
	typ, _ := jsonspan.String(b, f.typ.Start, f.typ.End)
	switch typ {
	case "image", "document":
		slot, ok := scanSource(b, f.source)
		if !ok || typ == "document" && slot.Via == "url" {
			return opaque, nil // a file id, a text or content source: the provider's, untouched
		}
		slot.Kind, slot.Pos, slot.Part = typ, pos, blk
		if f.cache.End > 0 {
			slot.Cache = b[f.cache.Start:f.cache.End]
		}
		s.Slots = append(s.Slots, slot)
		if typ == "document" {
			return chat.Document{}, nil
		}
		return chat.Image{}, nil
	case "tool_result":
		if pos.Nested >= 0 || f.content.End == 0 {
			return opaque, nil
		}
		id, _ := jsonspan.String(b, f.toolUseID.Start, f.toolUseID.End)
		nested, err := scanContent(s, f.content, wire.Pos{Msg: pos.Msg, Part: pos.Part, Nested: 0})
		if err != nil {
			return nil, err
		}
		return chat.ToolResult{CallID: id, Parts: nested}, nil
	}
	return opaque, nil
}

// scanSource reads a source object: base64 data (or an imgctx: ref in its
// place), or a url (http(s) or imgctx:).
func scanSource(b []byte, src wire.Span) (wire.Slot, bool) {
	if src.End == 0 || b[src.Start] != '{' {
		return wire.Slot{}, false
	}
	var typ, mt, data, url wire.Span
	if _, err := jsonspan.Object(b, src.Start, func(key []byte, vs, ve int) error {
		sp := wire.Span{Start: vs, End: ve}
		switch string(key) {
		case "type":
			typ = sp
		case "media_type":
			mt = sp
		case "data":
			data = sp
		case "url":
			url = sp
		}
		return nil
	}); err != nil {
		return wire.Slot{}, false
	}
	slot := wire.Slot{Source: src}
	slot.MediaType, _ = jsonspan.String(b, mt.Start, mt.End)
	t, _ := jsonspan.String(b, typ.Start, typ.End)
	switch t {
	case "base64":
		raw, plain := jsonspan.RawString(b, data.Start, data.End)
		if !plain {
			s, ok := jsonspan.String(b, data.Start, data.End)
			if !ok {
				return wire.Slot{}, false
			}
			raw = []byte(s)
		}
		if strings.HasPrefix(string(raw[:min(len(raw), 7)]), "imgctx:") {
			slot.Via, slot.URL = "ref", string(raw)
			return slot, true
		}
		slot.Via, slot.B64 = "base64", raw
		return slot, true
	case "url":
		u, ok := jsonspan.String(b, url.Start, url.End)
		if !ok {
			return wire.Slot{}, false
		}
		slot.Via, slot.URL = "url", u
		if strings.HasPrefix(u, "imgctx:") {
			slot.Via = "ref"
		}
		return slot, true
	}
	return wire.Slot{}, false
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
