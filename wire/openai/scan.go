package openai

import (
	"bytes"
	"fmt"
	"strings"

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
		var content, callID wire.Span
		_, err := jsonspan.Object(b, vs, func(key []byte, ks, ke int) error {
			switch string(key) {
			case "role":
				r, _ := jsonspan.String(b, ks, ke)
				m.Role = chat.Role(r)
				if r == "developer" {
					m.Role = chat.System
				}
			case "content":
				content = wire.Span{Start: ks, End: ke}
			case "tool_call_id":
				callID = wire.Span{Start: ks, End: ke}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.Messages = append(s.Messages, m)
		if content.End == 0 {
			return nil
		}
		pos := wire.Pos{Msg: i, Nested: -1}
		if m.Role == chat.Tool {
			pos.Nested = 0
		}
		parts, err := scanContent(s, content, pos)
		if err != nil {
			return fmt.Errorf("messages[%d]: %w", i, err)
		}
		if m.Role == chat.Tool {
			id, _ := jsonspan.String(b, callID.Start, callID.End)
			parts = []chat.Part{chat.ToolResult{CallID: id, Parts: parts}}
		}
		s.Messages[i].Parts = parts
		return nil
	})
	return err
}

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
		parts = append(parts, scanPart(s, wire.Span{Start: vs, End: ve}, p))
		return nil
	})
	return parts, err
}

func scanPart(s *wire.Spliced, sp wire.Span, pos wire.Pos) chat.Part {
	b := s.Body
	opaque := chat.Opaque{Wire: Wire, Raw: s.Text(sp)}
	if b[sp.Start] != '{' {
		return opaque
	}
	var typ, img, file wire.Span
	if _, err := jsonspan.Object(b, sp.Start, func(key []byte, vs, ve int) error {
		switch string(key) {
		case "type":
			typ = wire.Span{Start: vs, End: ve}
		case "image_url":
			img = wire.Span{Start: vs, End: ve}
		case "file":
			file = wire.Span{Start: vs, End: ve}
		}
		return nil
	}); err != nil {
		return opaque
	}
	t, _ := jsonspan.String(b, typ.Start, typ.End)
	var slot wire.Slot
	var ok bool
	switch t {
	case "image_url":
		slot, ok = urlSlot(b, img, "url")
		slot.Kind = "image"
	case "file":
		slot, ok = urlSlot(b, file, "file_data")
		ok = ok && slot.Via != "url" // file data inline or by ref; a file_id is the provider's own
		slot.Kind = "document"
	}
	if !ok {
		return opaque
	}
	slot.Pos, slot.Part = pos, sp
	s.Slots = append(s.Slots, slot)
	if slot.Kind == "document" {
		return chat.Document{}
	}
	return chat.Image{}
}

// urlSlot reads the object at obj for its URL-valued member key (image_url's
// url, file's file_data) and detail.
func urlSlot(b []byte, obj wire.Span, key string) (wire.Slot, bool) {
	if obj.End == 0 || b[obj.Start] != '{' {
		return wire.Slot{}, false
	}
	var u, detail wire.Span
	if _, err := jsonspan.Object(b, obj.Start, func(k []byte, vs, ve int) error {
		switch string(k) {
		case key:
			u = wire.Span{Start: vs, End: ve}
		case "detail":
			detail = wire.Span{Start: vs, End: ve}
		}
		return nil
	}); err != nil || u.End == 0 {
		return wire.Slot{}, false
	}
	slot := wire.Slot{Source: u}
	slot.Detail, _ = jsonspan.String(b, detail.Start, detail.End)
	raw, plain := jsonspan.RawString(b, u.Start, u.End)
	if !plain {
		s, ok := jsonspan.String(b, u.Start, u.End)
		if !ok {
			return wire.Slot{}, false
		}
		raw = []byte(s)
	}
	head := raw[:min(len(raw), 256)]
	if k := bytes.Index(head, []byte(";base64,")); k > 5 && bytes.HasPrefix(bytes.ToLower(head[:5]), []byte("data:")) {
		mt := string(head[5:k])
		if semi := strings.IndexByte(mt, ';'); semi >= 0 {
			mt = mt[:semi]
		}
		slot.Via, slot.MediaType, slot.B64 = "base64", mt, raw[k+len(";base64,"):]
		return slot, true
	}
	slot.URL = string(raw)
	slot.Via = "url"
	if strings.HasPrefix(slot.URL, "imgctx:") {
		slot.Via = "ref"
	}
	return slot, true
}

// WriteText writes a text part.
func WriteText(w *wire.BodyWriter, text string) {
	w.WriteString(`{"type":"text","text":`)
	w.Write(wire.Quote(text))
	w.WriteByte('}')
}
