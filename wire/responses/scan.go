// Package responses is the OpenAI Responses wire (POST /v1/responses), as
// the API reference documents it: a request's conversation is its "input"
// list of items — messages (content parts input_text, input_image,
// input_file, output_text, refusal), function_call and function_call_output
// (whose output may hold image and file parts), reasoning with its
// encrypted content, compaction items, and whatever type comes later —
// read in place like the other wires (wire.Spliced): only image and file
// parts are slots, every other byte goes upstream as it came.
package responses

import (
	"fmt"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Wire names this format in chat.Opaque parts and message tags.
const Wire = "responses"

// Scan reads a /v1/responses body in place: input_image parts with an
// image_url (a data URL, an imgctx: ref, an http(s) URL) and input_file
// parts with file_data are slots, at the top level of a message's content
// or inside a function_call_output's output. A string input, a file_id, and
// every other item, part and field stay as they came.
func Scan(body []byte, o wire.ScanOptions) (*wire.Spliced, error) {
	return wire.ScanList(body, o, "input", scanInput, "model", "stream", "instructions", "input")
}

func scanInput(s *wire.Spliced, at int) (int, error) {
	if s.Body[at] != '[' {
		// A string input is the human's text: nothing to manage.
		return jsonspan.End(s.Body, at)
	}
	return wire.WalkMessages(s, at, func(vs int) (int, error) { return scanItem(s, vs) })
}

// scanItem reads one input item: its type and role say what it is in the
// view (a message by its role; a tool's output as a tool message holding a
// tool result; any other item the assistant's), its content or output its
// parts.
func scanItem(s *wire.Spliced, at int) (int, error) {
	b := s.Body
	i := len(s.Messages)
	if b[at] != '{' {
		return at, fmt.Errorf("input[%d]: not an object", i)
	}
	var typ, role, callID string
	var content []chat.Part
	var output []chat.Part
	firstSlot := len(s.Slots)
	keys := wire.NewKeys("type", "role", "content", "output", "call_id")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		switch string(key) {
		case "content":
			parts, ve, err := scanParts(s, vs, wire.Pos{Msg: i, Nested: -1})
			content = parts
			return ve, err
		case "output":
			parts, ve, err := scanParts(s, vs, wire.Pos{Msg: i, Part: 0, Nested: 0})
			output = parts
			return ve, err
		}
		ve, err := jsonspan.End(b, vs)
		v, _ := jsonspan.String(b, vs, ve)
		switch string(key) {
		case "type":
			typ = v
		case "role":
			role = v
		case "call_id":
			callID = v
		}
		return ve, err
	})
	if err != nil {
		return end, fmt.Errorf("input[%d]: %w", i, err)
	}
	m := chat.Message{Wire: Wire}
	switch {
	case typ == "message" || typ == "" && role != "":
		m.Role, m.Parts = chat.Role(role), content
		if role == "developer" {
			m.Role = chat.System
		}
		err = keepSlots(s, firstSlot, func(p wire.Pos) bool { return p.Nested < 0 }) // an output on a message is not ours
	case strings.HasSuffix(typ, "_call_output"):
		// A tool's answer: its output's parts sit inside the tool result.
		if output == nil {
			output = []chat.Part{chat.Opaque{Wire: Wire}}
		}
		m.Role, m.Parts = chat.Tool, []chat.Part{chat.ToolResult{CallID: callID, Parts: output}}
		err = keepSlots(s, firstSlot, func(p wire.Pos) bool { return p.Nested >= 0 })
	default:
		// function_call, reasoning, compaction, item_reference, a type
		// added later: the model's side, passed as it came.
		if typ == "compaction" {
			s.Compaction()
		}
		err = keepSlots(s, firstSlot, func(wire.Pos) bool { return false })
		m.Role, m.Parts = chat.Assistant, []chat.Part{chat.Opaque{Wire: Wire}}
	}
	if err != nil {
		return end, fmt.Errorf("input[%d]: %w", i, err)
	}
	s.Messages = append(s.Messages, m)
	return end, nil
}

// keepSlots keeps, of the slots from first on, those at a place the item
// uses; the others go as they came, their base64 given the check decoding
// would have given it.
func keepSlots(s *wire.Spliced, first int, used func(wire.Pos) bool) error {
	kept := s.Slots[:first]
	for _, sl := range s.Slots[first:] {
		if used(sl.Pos) {
			kept = append(kept, sl)
		} else if sl.Via == "base64" {
			if err := jsonspan.Check(s.Body, sl.Source.Start, sl.Source.End); err != nil {
				return err
			}
		}
	}
	s.Slots = kept
	return nil
}

// scanParts reads a content or output value (wire.ScanParts): a part per
// element, read by scanPart.
func scanParts(s *wire.Spliced, at int, pos wire.Pos) ([]chat.Part, int, error) {
	return wire.ScanParts(s, at, pos, "content", chat.Opaque{Wire: Wire}, func(vs int, p wire.Pos) (chat.Part, int, error) { return scanPart(s, vs, p) })
}

// scanPart reads one part: an input_image with an image_url, or an
// input_file with file_data, is a slot; anything else is opaque.
func scanPart(s *wire.Spliced, at int, pos wire.Pos) (chat.Part, int, error) {
	b := s.Body
	if b[at] != '{' {
		end, err := jsonspan.End(b, at)
		return chat.Opaque{Wire: Wire}, end, err
	}
	var typ, detail, imageURL, fileData wire.Span
	keys := wire.NewKeys("type", "image_url", "file_data", "detail")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		var ve int
		var err error
		if k := string(key); k == "image_url" || k == "file_data" {
			ve, err = jsonspan.EndBase64(b, vs)
		} else {
			ve, err = jsonspan.End(b, vs)
		}
		sp := wire.Span{Start: vs, End: ve}
		switch string(key) {
		case "type":
			typ = sp
		case "detail":
			detail = sp
		case "image_url":
			imageURL = sp
		case "file_data":
			fileData = sp
		}
		return ve, err
	})
	if err != nil {
		return nil, end, err
	}
	var slot wire.Slot
	var ok bool
	switch t, _ := jsonspan.String(b, typ.Start, typ.End); t {
	case "input_image":
		if imageURL.End > 0 {
			slot, ok, err = wire.URLSlot(b, imageURL)
			slot.Kind = "image"
		}
	case "input_file":
		if fileData.End > 0 {
			slot, ok, err = wire.URLSlot(b, fileData)
			slot.Kind = "document"
			ok = ok && slot.Via != "url" // a file_url is the provider's to fetch
		}
	}
	if err != nil {
		return nil, end, err
	}
	// What was read in passing as base64 and is not the slot (not a slot
	// at all, or the other member of a part carrying both) goes upstream
	// as it came: it gets the check decoding would have given it.
	for _, u := range []wire.Span{imageURL, fileData} {
		if u.End > 0 && (!ok || u != slot.Source) {
			if err := jsonspan.Check(b, u.Start, u.End); err != nil {
				return nil, end, err
			}
		}
	}
	if !ok {
		return chat.Opaque{Wire: Wire}, end, nil
	}
	slot.Detail, _ = jsonspan.String(b, detail.Start, detail.End)
	slot.Pos, slot.Part = pos, wire.Span{Start: at, End: end}
	s.Add(slot)
	if slot.Kind == "document" {
		return chat.Document{}, end, nil
	}
	return chat.Image{}, end, nil
}

// WriteText writes an input_text part: what stands where an image or file
// part is not sent (a marker, a resize note).
func WriteText(w *wire.BodyWriter, text string) {
	w.WriteString(`{"type":"input_text","text":`)
	w.Write(wire.Quote(text))
	w.WriteByte('}')
}
