// Package openai translates the OpenAI Chat Completions wire format (also
// spoken by llama.cpp server, vLLM, Ollama and LM Studio) to and from
// imgctx's conversation model: requests, responses, streamed chunks and
// errors. Unknown fields are kept: an unchanged message is re-emitted byte
// for byte, and top-level fields pass through in their order.
package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Request is a decoded /v1/chat/completions request.
type Request struct {
	Model    string
	Stream   bool
	Messages []chat.Message

	top      wire.Object
	verbatim map[string]json.RawMessage // canonical chat JSON of a decoded message → its original bytes
	memo     *wire.Memo                 // a session's (EncodeSession)
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
	File     *fileJSON `json:"file,omitempty"`
	// Caption is imgctx's own field on a media part (sessions API): what
	// the image shows, for its marker. Never sent upstream.
	Caption string `json:"caption,omitempty"`
}

type fileJSON struct {
	FileData string `json:"file_data,omitempty"`
	FileID   string `json:"file_id,omitempty"`
	Filename string `json:"filename,omitempty"`
}

type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

type toolCallJSON struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

var messageKnown = []string{"role", "content", "tool_calls", "tool_call_id"}

// NewRequest starts a request of imgctx's own (a session's, a summary's).
func NewRequest(model string) *Request {
	return &Request{Model: model, top: wire.Object{{Key: "model", Value: mustJSON(model)}}}
}

// DecodeRequest reads a request. Images keep their URL as sent (a data URL,
// an https URL, or "imgctx:sha256-…"); ingesting them is the engine's job.
func DecodeRequest(b []byte) (*Request, error) {
	h, err := wire.ParseRequestHead(b)
	if err != nil {
		return nil, err
	}
	r := &Request{Model: h.Model, Stream: h.Stream, top: h.Top, verbatim: map[string]json.RawMessage{}}
	msgs := h.Messages
	for i, m := range msgs {
		msg, err := decodeMessage(m)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		r.Messages = append(r.Messages, msg)
		if canon, err := json.Marshal(msg); err == nil {
			r.verbatim[string(canon)] = m
		}
	}
	return r, nil
}

func decodeMessage(raw json.RawMessage) (chat.Message, error) {
	obj, err := wire.ParseObject(raw)
	if err != nil {
		return chat.Message{}, err
	}
	var m struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCalls  []toolCallJSON  `json:"tool_calls"`
		ToolCallID string          `json:"tool_call_id"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return chat.Message{}, err
	}
	msg := chat.Message{Extra: obj.Extra(messageKnown...), Wire: Wire}
	parts, err := decodeContent(m.Content)
	if err != nil {
		return chat.Message{}, err
	}
	switch m.Role {
	case "system", "developer":
		msg.Role = chat.System
		if m.Role == "developer" {
			msg.Extra = withExtra(msg.Extra, "role", json.RawMessage(`"developer"`))
		}
		msg.Parts = parts
	case "user":
		msg.Role, msg.Parts = chat.User, parts
	case "assistant":
		msg.Role, msg.Parts = chat.Assistant, parts
		for _, tc := range m.ToolCalls {
			msg.Parts = append(msg.Parts, chat.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
	case "tool":
		msg.Role = chat.Tool
		msg.Parts = []chat.Part{chat.ToolResult{CallID: m.ToolCallID, Parts: parts}}
	default:
		return chat.Message{}, fmt.Errorf("unknown role %q", m.Role)
	}
	return msg, nil
}

func withExtra(m map[string]json.RawMessage, k string, v json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	m[k] = v
	return m
}

func decodeContent(raw json.RawMessage) ([]chat.Part, error) {
	if s, ok, empty, err := wire.StringContent(raw); err != nil || empty {
		return nil, err
	} else if ok {
		return []chat.Part{chat.Text{Text: s}}, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, fmt.Errorf("content: %w", err)
	}
	var parts []chat.Part
	for i, r := range raws {
		var cp contentPart
		if err := json.Unmarshal(r, &cp); err != nil {
			return nil, fmt.Errorf("content[%d]: %w", i, err)
		}
		extra := ""
		if len(r) < 4096 || cp.Type != "image_url" && cp.Type != "file" { // a media part's extra fields sit beside megabytes of URL: only looked for in small parts
			extra = wire.ExtraOf(r, "type", "text", "image_url", "file", "caption")
		}
		switch {
		case cp.Type == "text":
			parts = append(parts, chat.Text{Text: cp.Text, Extra: extra})
		case cp.Type == "image_url":
			if cp.ImageURL == nil || cp.ImageURL.URL == "" {
				return nil, fmt.Errorf("content[%d]: image_url without a url", i)
			}
			parts = append(parts, chat.Image{URL: cp.ImageURL.URL, Detail: cp.ImageURL.Detail, Origin: chat.FromUser, Caption: cp.Caption, Extra: extra})
		case cp.Type == "file" && cp.File != nil && cp.File.FileData != "":
			parts = append(parts, chat.Document{URL: cp.File.FileData, Name: cp.File.Filename, Caption: cp.Caption, Extra: extra})
		default:
			// input_audio, a file by id, a part type added tomorrow: the
			// provider's, passed through as it came.
			parts = append(parts, chat.Opaque{Wire: Wire, Raw: string(r)})
		}
	}
	return parts, nil
}

// ImageURL returns how an image goes upstream: the standard base64 of a
// stored image with its media type (sent as a data URL, the base64 written
// as it is, without a copy), or the image's own URL. The engine provides it.
type ImageURL func(img chat.Image) (mediaType, base64Data, url string, err error)

// Encode writes the request with msgs in place of its messages. A message
// decoded from this request and not changed since is written as it came;
// others are encoded here. Every other top-level field is kept as sent.
// When streaming, stream_options.include_usage is turned on so the engine
// can measure.
func (r *Request) Encode(msgs []chat.Message, url ImageURL) ([]byte, error) {
	b, err := r.EncodeBody(msgs, url)
	return b.Bytes(), err
}

// EncodeBody is Encode keeping large strings (image URLs) as pieces of their
// own, so they reach the network without being copied into one buffer.
func (r *Request) EncodeBody(msgs []chat.Message, url ImageURL) (wire.Body, error) {
	top := append(wire.Object(nil), r.top...)
	if _, ok := top.Get("messages"); !ok {
		top.Set("messages", nil) // before stream_options, should that be added
	}
	if r.Stream {
		opts := map[string]any{}
		if v, ok := top.Get("stream_options"); ok {
			_ = json.Unmarshal(v, &opts)
		}
		if opts["include_usage"] != true {
			opts["include_usage"] = true
			b, _ := wire.Marshal(opts)
			top.Set("stream_options", b)
		}
	}
	var w wire.BodyWriter
	err := wire.WriteObject(&w, top, "messages", func(w *wire.BodyWriter) error {
		w.WriteByte('[')
		for j, m := range msgs {
			if j > 0 {
				w.WriteByte(',')
			}
			if len(r.verbatim) > 0 {
				if canon, err := json.Marshal(m); err == nil {
					if v, ok := r.verbatim[string(canon)]; ok {
						w.Write(v)
						continue
					}
				}
			}
			one := msgs[j : j+1]
			if err := r.memo.Write(w, j, one, "", func(w wire.JSONWriter) error { return writeMessage(w, m, url) }); err != nil {
				return fmt.Errorf("message %d: %w", j, err)
			}
		}
		w.WriteByte(']')
		return nil
	})
	return w.Body(), err
}

// EncodeMessage writes one message in the Chat Completions shape: a single
// text part as a string, anything else as a content array; markers,
// summaries and documents as text; images through url.
func EncodeMessage(m chat.Message, url ImageURL) ([]byte, error) {
	var b bytes.Buffer
	err := writeMessage(&b, m, url)
	return b.Bytes(), err
}

// ours reports whether m's extra fields belong to this wire: a message
// decoded from another wire's JSON carries none of them here.
func ours(m chat.Message) bool { return m.Wire == "" || m.Wire == Wire }

func writeMessage(w wire.JSONWriter, m chat.Message, url ImageURL) error {
	if !ours(m) {
		m.Extra = nil
		m.Parts = withoutExtras(m.Parts)
	}
	role := string(m.Role)
	if v, ok := m.Extra["role"]; ok && m.Role == chat.System {
		var r string
		_ = json.Unmarshal(v, &r)
		role = r
	}
	var content []chat.Part
	var calls []toolCallJSON
	var callID string
	for _, p := range m.Parts {
		switch p := p.(type) {
		case chat.ToolCall:
			tc := toolCallJSON{ID: p.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = p.Name, p.Arguments
			calls = append(calls, tc)
		case chat.ToolResult:
			callID = p.CallID
			content = append(content, p.Parts...)
		default:
			content = append(content, p)
		}
	}
	w.WriteString(`{"role":`)
	w.Write(mustJSON(role))
	w.WriteString(`,"content":`)
	if err := writeContent(w, content, url, m.Role == chat.Assistant && len(calls) > 0); err != nil {
		return err
	}
	if len(calls) > 0 {
		w.WriteString(`,"tool_calls":`)
		w.Write(mustJSON(calls))
	}
	if m.Role == chat.Tool {
		w.WriteString(`,"tool_call_id":`)
		w.Write(mustJSON(callID))
	}
	for _, k := range slices.Sorted(maps.Keys(m.Extra)) {
		if k != "role" {
			w.WriteByte(',')
			w.Write(mustJSON(k))
			w.WriteByte(':')
			w.Write(m.Extra[k])
		}
	}
	w.WriteByte('}')
	return nil
}

// withoutExtras returns parts with every Extra cleared and other wires'
// opaque parts left out.
func withoutExtras(parts []chat.Part) []chat.Part {
	out := make([]chat.Part, 0, len(parts))
	for _, p := range parts {
		switch q := p.(type) {
		case chat.Text:
			q.Extra = ""
			p = q
		case chat.Image:
			q.Extra = ""
			p = q
		case chat.Document:
			q.Extra = ""
			p = q
		case chat.ToolCall:
			q.Extra = ""
			p = q
		case chat.ToolResult:
			q.Extra, q.Parts = "", withoutExtras(q.Parts)
			p = q
		case chat.Opaque:
			if q.Wire != Wire {
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

func writeContent(b wire.JSONWriter, parts []chat.Part, url ImageURL, nullable bool) error {
	if len(parts) == 0 {
		if nullable {
			b.WriteString("null")
		} else {
			b.WriteString(`""`)
		}
		return nil
	}
	if t, ok := parts[0].(chat.Text); ok && len(parts) == 1 && t.Extra == "" {
		b.Write(mustJSON(t.Text))
		return nil
	}
	// Written by hand: an image URL is megabytes of base64 that needs no
	// escaping, and encoding/json would scan and copy it several times.
	b.WriteByte('[')
	n := 0
	next := func() {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
	}
	text := func(s, extra string) {
		next()
		b.WriteString(`{"type":"text","text":`)
		b.Write(mustJSON(s))
		wire.WriteExtra(b, extra)
		b.WriteByte('}')
	}
	for _, p := range parts {
		switch p := p.(type) {
		case chat.Text:
			text(p.Text, p.Extra)
		case chat.Summary:
			text(p.Text, "")
		case chat.Marker:
			text(p.String(), "")
		case chat.Document:
			if !p.Ref.Valid() && p.URL == "" {
				// Extracted text only: this wire carries it as text.
				s := "[document: " + p.MediaType + "]"
				if p.Text != "" {
					s += "\n" + p.Text
				}
				text(s, p.Extra)
				continue
			}
			// A file part, its data byte-exact from the stored ref.
			mediaType, data, u, err := url(chat.Image{Ref: p.Ref, MediaType: p.MediaType, URL: p.URL})
			if err != nil {
				return err
			}
			next()
			b.WriteString(`{"type":"file","file":{`)
			if p.Name != "" {
				b.WriteString(`"filename":`)
				b.Write(mustJSON(p.Name))
				b.WriteByte(',')
			}
			b.WriteString(`"file_data":`)
			if data != "" {
				wire.WriteDataURL(b, mediaType, data)
			} else {
				wire.WriteString(b, u)
			}
			b.WriteByte('}')
			wire.WriteExtra(b, p.Extra)
			b.WriteByte('}')
		case chat.Opaque:
			if p.Wire == Wire {
				next()
				b.WriteString(p.Raw)
			}
		case chat.Image:
			mediaType, data, u, err := url(p)
			if err != nil {
				return err
			}
			next()
			b.WriteString(`{"type":"image_url","image_url":{"url":`)
			if data != "" {
				wire.WriteDataURL(b, mediaType, data)
			} else {
				wire.WriteString(b, u)
			}
			if p.Detail != "" {
				b.WriteString(`,"detail":`)
				b.Write(mustJSON(p.Detail))
			}
			b.WriteByte('}')
			wire.WriteExtra(b, p.Extra)
			b.WriteByte('}')
		}
	}
	b.WriteByte(']')
	return nil
}

func mustJSON(v any) json.RawMessage {
	b, err := wire.Marshal(v) // never HTML-escaped: "<" stays "<"
	if err != nil {
		panic(err) // only values built here, which always encode
	}
	return b
}

// Response is a decoded non-streaming response, or a streamed one
// accumulated.
type Response struct {
	Message chat.Message
	Usage   *chat.Usage // nil when the upstream reported none
	Finish  string
	Cut     bool // the completion was cut by the token limit
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens     int `json:"cached_tokens"`
		CacheWriteTokens int `json:"cache_write_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageJSON) usage() *chat.Usage {
	if u == nil {
		return nil
	}
	out := &chat.Usage{Prompt: u.PromptTokens, Output: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil {
		out.CacheRead, out.CacheWrite = d.CachedTokens, d.CacheWriteTokens
	}
	return out
}

// usageKeys are usageJSON's numbers, for wire.Ints.
var usageKeys = []string{"prompt_tokens", "completion_tokens", "prompt_tokens_details.cached_tokens", "prompt_tokens_details.cache_write_tokens"}

// usageOf decodes a usage object: its numbers read from their spans, or
// by encoding/json where that might read them otherwise.
func usageOf(raw []byte) *chat.Usage {
	var n [4]int
	if wire.Ints(raw, usageKeys, n[:]) {
		return &chat.Usage{Prompt: n[0], Output: n[1], CacheRead: n[2], CacheWrite: n[3]}
	}
	var u usageJSON
	if json.Unmarshal(raw, &u) != nil {
		return nil
	}
	return u.usage()
}

// DecodeResponse reads a non-streaming response (the first choice).
func DecodeResponse(b []byte) (*Response, error) {
	var r struct {
		Choices []struct {
			Message      json.RawMessage `json:"message"`
			FinishReason string          `json:"finish_reason"`
		} `json:"choices"`
		Usage *usageJSON `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	if len(r.Choices) == 0 {
		return nil, fmt.Errorf("response has no choices")
	}
	msg, err := decodeMessage(r.Choices[0].Message)
	if err != nil {
		return nil, fmt.Errorf("response message: %w", err)
	}
	fin := r.Choices[0].FinishReason
	return &Response{Message: msg, Usage: r.Usage.usage(), Finish: fin, Cut: fin == "length"}, nil
}

// Stream accumulates streamed chunks into a Response.
type Stream struct {
	text   strings.Builder
	calls  []chat.ToolCall
	finish string
	usage  *chat.Usage
	done   bool
}

// Add takes one event's data: a chunk, or "[DONE]".
func (s *Stream) Add(data []byte) error {
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.done = true
		return nil
	}
	var c struct {
		Choices []struct {
			Delta struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					Index    int    `json:"index"`
					ID       string `json:"id"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *usageJSON `json:"usage"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("stream chunk: %w", err)
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil {
			s.text.WriteString(*ch.Delta.Content)
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.Index < 0 || tc.Index > 1024 {
				return fmt.Errorf("stream chunk: tool call index %d", tc.Index)
			}
			for len(s.calls) <= tc.Index {
				s.calls = append(s.calls, chat.ToolCall{})
			}
			call := &s.calls[tc.Index]
			if tc.ID != "" {
				call.ID = tc.ID
			}
			call.Name += tc.Function.Name
			call.Arguments += tc.Function.Arguments
		}
		if ch.FinishReason != nil {
			s.finish = *ch.FinishReason
		}
	}
	if u := c.Usage.usage(); u != nil {
		s.usage = u
	}
	return nil
}

// Done reports whether the "[DONE]" event was seen.
func (s *Stream) Done() bool { return s.done }

// Response returns what the stream said so far.
func (s *Stream) Response() *Response {
	msg := chat.Message{Role: chat.Assistant}
	if s.text.Len() > 0 {
		msg.Parts = append(msg.Parts, chat.Text{Text: s.text.String()})
	}
	for _, c := range s.calls {
		msg.Parts = append(msg.Parts, c)
	}
	return &Response{Message: msg, Usage: s.usage, Finish: s.finish, Cut: s.finish == "length"}
}

// DecodeError classifies an error response:
// {"error": {"message", "type", "param", "code"}}.
func DecodeError(status int, h http.Header, body []byte) *wire.Error {
	e := &wire.Error{Status: status, Kind: wire.KindForStatus(status), Body: body, RetryAfter: wire.RetryAfter(h, time.Now())}
	var j struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &j) != nil || j.Error.Message == "" {
		e.Message = strings.TrimSpace(string(body[:min(len(body), 300)]))
		return e
	}
	e.Message, e.Type = j.Error.Message, j.Error.Type
	code, _ := j.Error.Code.(string)
	if code != "" {
		e.Type = code
	}
	msg := strings.ToLower(e.Message)
	switch {
	case code == "context_length_exceeded" || strings.Contains(msg, "maximum context length") ||
		strings.Contains(msg, "exceeds the context window") || strings.Contains(msg, "prompt is too long"):
		e.Kind = wire.PromptTooLong
	case code == "insufficient_quota":
		e.Kind = wire.BadRequest // a 429 that no retry will cure
	case status == 400 && (strings.Contains(code, "image") || strings.Contains(msg, "image")):
		e.Kind = wire.InvalidImage
	}
	return e
}

// DecodeMessage reads one wire message.
func DecodeMessage(raw []byte) ([]chat.Message, error) {
	m, err := decodeMessage(raw)
	if err != nil {
		return nil, err
	}
	return []chat.Message{m}, nil
}
