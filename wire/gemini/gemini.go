// Package gemini is Google's Gemini wire (generateContent,
// streamGenerateContent, countTokens under /v1beta/models/{model}:…) as the
// API reference documents it: a request's conversation is "contents", each
// with a role (user, model) and parts — text, inlineData, fileData,
// functionCall, functionResponse (whose own parts may hold inline media),
// thought parts with their signatures. It is read in place like the other
// wires (wire.Spliced): inline media are slots, everything else goes
// upstream as it came. JSON field names are taken in either of the forms the
// API accepts (inlineData, inline_data).
package gemini

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Wire names this format in chat.Opaque parts and message tags.
const Wire = "gemini"

// Scan reads a generateContent body in place. The model and whether it
// streams are in the URL, not the body: the caller sets them.
func Scan(body []byte, o wire.ScanOptions) (*wire.Spliced, error) {
	return wire.ScanList(body, o, "contents", scanContents, "contents", "systemInstruction", "system_instruction")
}

func scanContents(s *wire.Spliced, at int) (int, error) {
	return wire.WalkMessages(s, at, func(vs int) (int, error) { return scanContent(s, vs) })
}

// scanContent reads one content: a model content is the assistant's; a
// user content holding functionResponse parts is the tools' answer (each a
// tool result, its parts nested), otherwise the human's.
func scanContent(s *wire.Spliced, at int) (int, error) {
	b := s.Body
	i := len(s.Messages)
	if b[at] != '{' {
		return at, fmt.Errorf("contents[%d]: not an object", i)
	}
	m := chat.Message{Role: chat.User, Wire: Wire}
	keys := wire.NewKeys("role", "parts")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		switch string(key) {
		case "role":
			ve, err := jsonspan.End(b, vs)
			if r, _ := jsonspan.String(b, vs, ve); r == "model" {
				m.Role = chat.Assistant
			}
			return ve, err
		case "parts":
			parts, ve, err := scanParts(s, vs, wire.Pos{Msg: i, Nested: -1})
			m.Parts = parts
			return ve, err
		}
		return jsonspan.End(b, vs)
	})
	if err != nil {
		return end, fmt.Errorf("contents[%d]: %w", i, err)
	}
	for _, p := range m.Parts {
		if _, ok := p.(chat.ToolResult); ok && m.Role == chat.User {
			m.Role = chat.Tool
		}
	}
	s.Messages = append(s.Messages, m)
	return end, nil
}

// scanParts reads a parts array (wire.ScanParts), each part by scanPart.
func scanParts(s *wire.Spliced, at int, pos wire.Pos) ([]chat.Part, int, error) {
	return wire.ScanParts(s, at, pos, "parts", chat.Opaque{Wire: Wire}, func(vs int, p wire.Pos) (chat.Part, int, error) { return scanPart(s, vs, p) })
}

// scanPart reads one part: inlineData is a slot; a top-level
// functionResponse is a tool result whose parts are read in turn; any
// other part is opaque.
func scanPart(s *wire.Spliced, at int, pos wire.Pos) (chat.Part, int, error) {
	b := s.Body
	if b[at] != '{' {
		end, err := jsonspan.End(b, at)
		return chat.Opaque{Wire: Wire}, end, err
	}
	var inline wire.Span
	var result *chat.ToolResult
	keys := wire.NewKeys("inlineData", "inline_data", "functionResponse", "function_response")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		switch string(key) {
		case "inlineData", "inline_data":
			if inline.End != 0 {
				return vs, bothSpellings("a part", "inlineData", "inline_data")
			}
			ve, err := inlineEnd(b, vs)
			inline = wire.Span{Start: vs, End: ve}
			return ve, err
		case "functionResponse", "function_response":
			if result != nil {
				return vs, bothSpellings("a part", "functionResponse", "function_response")
			}
			if pos.Nested >= 0 || b[vs] != '{' {
				break // only a top-level part's response is read
			}
			tr, ve, err := scanResponse(s, vs, pos)
			result = &tr
			return ve, err
		}
		return jsonspan.End(b, vs)
	})
	if err != nil {
		return nil, end, err
	}
	if result != nil {
		return *result, end, nil
	}
	if inline.End == 0 {
		return chat.Opaque{Wire: Wire}, end, nil
	}
	slot, ok, err := inlineSlot(b, inline)
	if err != nil || !ok {
		return chat.Opaque{Wire: Wire}, end, err
	}
	slot.Pos, slot.Part = pos, wire.Span{Start: at, End: end}
	s.Add(slot)
	if slot.Kind == "document" {
		return chat.Document{}, end, nil
	}
	return chat.Image{}, end, nil
}

// scanResponse reads a functionResponse object: its name and its parts
// (Gemini 3: media a function returns), nested in the tool result.
func scanResponse(s *wire.Spliced, at int, pos wire.Pos) (chat.ToolResult, int, error) {
	b := s.Body
	var tr chat.ToolResult
	keys := wire.NewKeys("name", "parts", "id")
	end, err := jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		if string(key) == "parts" {
			parts, ve, err := scanParts(s, vs, wire.Pos{Msg: pos.Msg, Part: pos.Part, Nested: 0})
			tr.Parts = parts
			return ve, err
		}
		ve, err := jsonspan.End(b, vs)
		v, _ := jsonspan.String(b, vs, ve)
		switch string(key) {
		case "name":
			tr.Name = v
		case "id":
			tr.CallID = v
		}
		return ve, err
	})
	if tr.Parts == nil {
		tr.Parts = []chat.Part{chat.Opaque{Wire: Wire}} // the response object itself
	}
	return tr, end, err
}

// bothSpellings refuses a member given in both of Gemini's spellings:
// imgctx would read one, an upstream may read the other.
func bothSpellings(what, camel, snake string) error {
	return fmt.Errorf("%s with both %s and %s: refused, an upstream may read either", what, camel, snake)
}

// inlineEnd is the end of an inlineData object, its data read without
// checking the base64 characters (decoding does).
func inlineEnd(b []byte, at int) (int, error) {
	if b[at] != '{' {
		return jsonspan.End(b, at)
	}
	return jsonspan.Object(b, at, func(key []byte, vs int) (int, error) {
		if string(key) == "data" {
			return jsonspan.EndBase64(b, vs)
		}
		return jsonspan.End(b, vs)
	})
}

// inlineSlot reads an inlineData object {mimeType, data}: the object is
// the slot's source (rewritten whole), data its base64. An image is an
// image slot, a PDF a document slot; other media (audio, video) are not
// imgctx's and pass as they came, their base64 checked.
func inlineSlot(b []byte, obj wire.Span) (wire.Slot, bool, error) {
	var mime, data wire.Span
	if b[obj.Start] != '{' {
		return wire.Slot{}, false, nil
	}
	keys := wire.NewKeys("mimeType", "mime_type", "data")
	_, err := jsonspan.Object(b, obj.Start, func(key []byte, vs int) (int, error) {
		if err := keys.Check(key); err != nil {
			return vs, err
		}
		var ve int
		var err error
		if string(key) == "data" {
			ve, err = jsonspan.EndBase64(b, vs)
			data = wire.Span{Start: vs, End: ve}
		} else {
			if mime.End != 0 {
				return vs, bothSpellings("inline data", "mimeType", "mime_type")
			}
			ve, err = jsonspan.End(b, vs)
			mime = wire.Span{Start: vs, End: ve}
		}
		return ve, err
	})
	if err != nil {
		return wire.Slot{}, false, err
	}
	mt, _ := jsonspan.String(b, mime.Start, mime.End)
	// The MIME type as a lenient upstream reads it ("IMAGE/PNG", " image/png"):
	// an image in any spelling is managed.
	mt = strings.ToLower(strings.TrimSpace(mt))
	kind := ""
	switch {
	case strings.HasPrefix(mt, "image/"):
		kind = "image"
	case mt == "application/pdf":
		kind = "document"
	}
	if kind == "" || data.End-data.Start < 2 || b[data.Start] != '"' {
		if data.End > 0 {
			return wire.Slot{}, false, jsonspan.Check(b, data.Start, data.End)
		}
		return wire.Slot{}, false, nil
	}
	return wire.Slot{Source: obj, Kind: kind, Via: "base64", MediaType: mt,
		Data: wire.Span{Start: data.Start + 1, End: data.End - 1}}, true, nil
}

// WriteSource writes an inlineData object.
func WriteSource(w *wire.BodyWriter, mediaType, b64 string) {
	w.WriteString(`{"mimeType":`)
	w.Write(wire.Quote(mediaType))
	w.WriteString(`,"data":"`)
	w.WriteString(b64)
	w.WriteString(`"}`)
}

// WriteText writes a text part.
func WriteText(w *wire.BodyWriter, text string) {
	w.WriteString(`{"text":`)
	w.Write(wire.Quote(text))
	w.WriteByte('}')
}

// DecodeContent reads what a content bills as text — its text parts, a
// function call as its JSON, a function response's name and response — one
// text part each, for the engine to subtract from a measurement (inline media
// are measured; thought signatures count nothing).
func DecodeContent(raw []byte) ([]chat.Message, error) {
	var c struct {
		Role  string `json:"role"`
		Parts []struct {
			Text         string          `json:"text"`
			Thought      bool            `json:"thought"`
			FunctionCall json.RawMessage `json:"functionCall"`
			FunctionResp json.RawMessage `json:"functionResponse"`
		} `json:"parts"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	var parts []chat.Part
	add := func(s string) {
		if s != "" {
			parts = append(parts, chat.Text{Text: s})
		}
	}
	for _, p := range c.Parts {
		add(p.Text)
		add(string(p.FunctionCall))
		if len(p.FunctionResp) > 0 {
			var f struct {
				Name     string          `json:"name"`
				Response json.RawMessage `json:"response"`
			}
			if json.Unmarshal(p.FunctionResp, &f) == nil {
				add(f.Name)
				add(string(f.Response))
			}
		}
	}
	return []chat.Message{{Parts: parts}}, nil
}

type responseJSON struct {
	Candidates []struct {
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	UsageMetadata *struct {
		PromptTokenCount        int `json:"promptTokenCount"`
		CandidatesTokenCount    int `json:"candidatesTokenCount"`
		CachedContentTokenCount int `json:"cachedContentTokenCount"`
		ThoughtsTokenCount      int `json:"thoughtsTokenCount"`
	} `json:"usageMetadata"`
}

func (r responseJSON) read() (u *chat.Usage, cut, finished bool) {
	for _, c := range r.Candidates {
		finished = finished || c.FinishReason != ""
		cut = cut || c.FinishReason == "MAX_TOKENS"
	}
	if m := r.UsageMetadata; m != nil {
		u = &chat.Usage{Prompt: m.PromptTokenCount, CacheRead: m.CachedContentTokenCount, Output: m.CandidatesTokenCount + m.ThoughtsTokenCount}
	}
	return u, cut, finished
}

// DecodeResponse reads a GenerateContentResponse's usage (nil when it has
// none) and whether a candidate was cut by MAX_TOKENS.
func DecodeResponse(b []byte) (*chat.Usage, bool, error) {
	var r responseJSON
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, false, err
	}
	u, cut, _ := r.read()
	return u, cut, nil
}

// Stream follows streamGenerateContent's chunks (alt=sse): each is a
// GenerateContentResponse; the usage is the last one reported, the stream
// done once a candidate has a finish reason.
type Stream struct {
	usage     *chat.Usage
	cut, done bool
}

// Add takes one event's data.
func (s *Stream) Add(data []byte) {
	var r responseJSON
	if json.Unmarshal(data, &r) != nil {
		return
	}
	u, cut, finished := r.read()
	if u != nil {
		s.usage = u
	}
	s.cut = s.cut || cut
	s.done = s.done || finished
}

// Done reports whether a finish reason came.
func (s *Stream) Done() bool { return s.done }

// Usage is the last usage reported and whether the output was cut.
func (s *Stream) Usage() (*chat.Usage, bool) { return s.usage, s.cut }

// DecodeError classifies a Google API error ({"error": {"code",
// "message", "status"}}): over the input token limit is prompt-too-long.
func DecodeError(status int, h http.Header, body []byte) *wire.Error {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	json.Unmarshal(body, &e)
	we := &wire.Error{Status: status, Type: e.Error.Status, Message: e.Error.Message, Body: body, RetryAfter: wire.RetryAfter(h, time.Now())}
	if we.Message == "" {
		we.Message = http.StatusText(status)
	}
	msg := strings.ToLower(e.Error.Message)
	switch {
	case status == http.StatusBadRequest && strings.Contains(msg, "token") && (strings.Contains(msg, "exceed") || strings.Contains(msg, "too long") || strings.Contains(msg, "limit")):
		we.Kind = wire.PromptTooLong
	case status == http.StatusBadRequest && strings.Contains(msg, "image"):
		we.Kind = wire.InvalidImage
	default:
		we.Kind = wire.KindForStatus(status)
	}
	return we
}
