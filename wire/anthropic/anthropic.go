// Package anthropic translates the Anthropic Messages wire format to and
// from imgctx's conversation model: requests (system, content blocks, tool
// use and results carrying images, cache_control), responses, streamed
// events and errors. Unknown top-level fields pass through in their order;
// an unchanged message is re-emitted byte for byte.
package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Request is a decoded /v1/messages request.
type Request struct {
	Model    string
	Stream   bool
	Messages []chat.Message // the system prompt, if any, first as a System message

	top      wire.Object
	verbatim map[string]json.RawMessage
	// systemTop: a leading System message is the top-level system prompt
	// (imgctx's own requests, and decoded ones that had one); otherwise
	// system messages stay inside messages, where the client put them.
	systemTop bool
	memo      *wire.Memo // a session's (EncodeSession)
}

type source struct {
	Type      string `json:"type"` // base64, url, text, file
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
	FileID    string `json:"file_id,omitempty"`
}

type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Source    *source         `json:"source,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
	Title     string          `json:"title,omitempty"`
	Cache     *cacheControl   `json:"cache_control,omitempty"`
	extra     string          // unknown fields of a decoded block, re-emitted
	nested    []block         // a tool result's content, when encoding
	raw       string          // an opaque block, written as it came
}

// blockKnown are the block fields imgctx models; anything else, the
// client's own cache_control included, travels in the part's Extra.
var blockKnown = []string{"type", "text", "source", "id", "name", "input", "tool_use_id", "content", "is_error", "title"}

type cacheControl struct {
	Type string `json:"type"`
	TTL  string `json:"ttl,omitempty"`
}

// NewRequest starts a request of imgctx's own (a session's, a summary's).
func NewRequest(model string, maxTokens int) *Request {
	return &Request{Model: model, systemTop: true, top: wire.Object{{Key: "model", Value: mustJSON(model)}, {Key: "max_tokens", Value: mustJSON(maxTokens)}}}
}

// DecodeRequest reads a request. Images and documents keep a data URL (or
// their remote URL) for the engine to ingest.
func DecodeRequest(b []byte) (*Request, error) {
	h, err := wire.ParseRequestHead(b)
	if err != nil {
		return nil, err
	}
	r := &Request{Model: h.Model, Stream: h.Stream, top: h.Top, verbatim: map[string]json.RawMessage{}}
	if v, ok := h.Top.Get("system"); ok {
		parts, err := decodeContent(v)
		if err != nil {
			return nil, fmt.Errorf("system: %w", err)
		}
		r.Messages = append(r.Messages, chat.Message{Role: chat.System, Parts: parts, Wire: Wire})
		r.systemTop = true
	}
	msgs := h.Messages
	for i, m := range msgs {
		out, err := decodeMessage(m)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		r.Messages = append(r.Messages, out...)
		if len(out) == 1 {
			if canon, err := json.Marshal(out[0]); err == nil {
				r.verbatim[string(canon)] = m
			}
		}
	}
	return r, nil
}

// decodeMessage reads one message. A user message carrying tool results
// becomes a Tool message (the results) and, when other blocks follow, a User
// message: runs of blocks keep their order.
func decodeMessage(raw json.RawMessage) ([]chat.Message, error) {
	obj, err := wire.ParseObject(raw)
	if err != nil {
		return nil, err
	}
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	var role chat.Role
	switch m.Role {
	case "user":
		role = chat.User
	case "assistant":
		role = chat.Assistant
	case "system": // mid-conversation instructions, as newer clients send them
		role = chat.System
	default:
		return nil, fmt.Errorf("unknown role %q", m.Role)
	}
	parts, err := decodeContent(m.Content)
	if err != nil {
		return nil, err
	}
	extra := obj.Extra("role", "content")
	var out []chat.Message
	for _, p := range parts {
		r := role
		if _, ok := p.(chat.ToolResult); ok {
			r = chat.Tool
		}
		if len(out) == 0 || out[len(out)-1].Role != r {
			out = append(out, chat.Message{Role: r, Extra: extra, Wire: Wire})
		}
		out[len(out)-1].Parts = append(out[len(out)-1].Parts, p)
	}
	if len(out) == 0 {
		out = []chat.Message{{Role: role, Extra: extra, Wire: Wire}}
	}
	return out, nil
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
		var b block
		if err := json.Unmarshal(r, &b); err != nil {
			return nil, fmt.Errorf("content[%d]: %w", i, err)
		}
		p, err := decodeBlock(b)
		if errors.Is(err, errOpaque) {
			parts = append(parts, chat.Opaque{Wire: Wire, Raw: string(r)})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("content[%d]: %w", i, err)
		}
		if extra := blockExtra(r, b); extra != "" {
			p = withExtra(p, extra)
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// blockExtra returns a block's unknown fields. An image's base64 can be
// megabytes: its extras are only looked for in blocks the gateway has
// already lifted (small ones).
func blockExtra(raw json.RawMessage, b block) string {
	if len(raw) > 4096 && (b.Type == "image" || b.Type == "document" || b.Type == "tool_result") {
		return ""
	}
	return wire.ExtraOf(raw, blockKnown...)
}

func withExtra(p chat.Part, extra string) chat.Part {
	switch q := p.(type) {
	case chat.Text:
		q.Extra = extra
		return q
	case chat.Image:
		q.Extra = extra
		return q
	case chat.Document:
		q.Extra = extra
		return q
	case chat.ToolCall:
		q.Extra = extra
		return q
	case chat.ToolResult:
		q.Extra = extra
		return q
	}
	return p
}

// errOpaque says a block is one imgctx passes through as it came: a type
// it does not model (thinking, server tools, a type added tomorrow), or a
// source it does not manage (a file id, a content list).
var errOpaque = errors.New("opaque block")

func decodeBlock(b block) (chat.Part, error) {
	if (b.Type == "image" || b.Type == "document") && b.Source != nil && b.Source.Type != "base64" && b.Source.Type != "url" && b.Source.Type != "text" {
		return nil, errOpaque
	}
	switch b.Type {
	case "text":
		return chat.Text{Text: b.Text}, nil
	case "image":
		u, mt, err := sourceURL(b.Source)
		if err != nil {
			return nil, err
		}
		return chat.Image{URL: u, MediaType: mt, Origin: chat.FromUser}, nil
	case "document":
		if b.Source != nil && b.Source.Type == "text" {
			return chat.Document{MediaType: "text/plain", Text: b.Source.Data, Name: b.Title}, nil
		}
		u, mt, err := sourceURL(b.Source)
		if err != nil {
			return nil, err
		}
		return chat.Document{URL: u, MediaType: mt, Name: b.Title}, nil
	case "tool_use":
		input := string(b.Input)
		if input == "" {
			input = "{}"
		}
		return chat.ToolCall{ID: b.ID, Name: b.Name, Arguments: input}, nil
	case "tool_result":
		nested, err := decodeContent(b.Content)
		if err != nil {
			return nil, err
		}
		for i, p := range nested {
			if img, ok := p.(chat.Image); ok {
				img.Origin = chat.FromTool
				nested[i] = img
			}
			if _, ok := p.(chat.ToolResult); ok {
				return nil, fmt.Errorf("a tool_result inside a tool_result")
			}
		}
		return chat.ToolResult{CallID: b.ToolUseID, IsError: b.IsError, Parts: nested}, nil
	}
	return nil, errOpaque
}

func sourceURL(s *source) (url, mediaType string, err error) {
	if s == nil {
		return "", "", fmt.Errorf("block without a source")
	}
	switch s.Type {
	case "base64":
		if s.Data == "" {
			return "", "", fmt.Errorf("base64 source without data")
		}
		if strings.HasPrefix(s.Data, "imgctx:") { // lifted out by the gateway before parsing
			return s.Data, s.MediaType, nil
		}
		return "data:" + s.MediaType + ";base64," + s.Data, s.MediaType, nil
	case "url":
		if s.URL == "" {
			return "", "", fmt.Errorf("url source without a url")
		}
		return s.URL, s.MediaType, nil
	}
	return "", "", fmt.Errorf("source type %q is not supported", s.Type)
}

// Source returns how an image goes upstream: standard base64 data (written
// as it is) with its media type, or a URL. The engine provides it.
type Source func(img chat.Image) (mediaType, base64Data, url string, err error)

// Cache says where imgctx puts cache breakpoints: on the system prompt
// and on the last block of the messages at the given indexes (indexes into
// the msgs given to Encode). At most four in all, as the API allows.
type Cache struct {
	System   bool
	Messages []int
	// Hour: every breakpoint but the one on the newest message keeps its
	// prefix for an hour ("ttl": "1h"); the newest keeps the default five
	// minutes, after them, as the API wants longer lifetimes first.
	Hour bool
}

// ttl is the lifetime of the breakpoint on message k (-1: the system
// prompt): "" the default.
func (c Cache) ttl(k int) string {
	if !c.Hour || (len(c.Messages) > 0 && k == c.Messages[len(c.Messages)-1]) {
		return ""
	}
	return "1h"
}

// Encode writes the request with msgs (system first, if any) in place of
// its system prompt and messages. An unchanged message is written as it
// came unless a breakpoint must go on it; every other top-level field is
// kept as sent.
func (r *Request) Encode(msgs []chat.Message, src Source, cache Cache) ([]byte, error) {
	b, err := r.EncodeBody(msgs, src, cache)
	return b.Bytes(), err
}

// EncodeBody is Encode keeping image data as pieces of their own, so
// megabytes of base64 reach the network without being copied into one
// buffer. Blocks are written by hand: encoding/json would scan and copy
// every image several times.
func (r *Request) EncodeBody(msgs []chat.Message, src Source, cache Cache) (wire.Body, error) {
	top := append(wire.Object(nil), r.top...)
	cache = cache.fit(msgs)
	start := 0
	if len(msgs) > 0 && msgs[0].Role == chat.System && r.systemTop {
		blocks, err := encodeBlocks(msgs[0].Parts, src, ours(msgs[0]))
		if err != nil {
			return wire.Body{}, fmt.Errorf("system: %w", err)
		}
		markBreakpoint(blocks, cache.System, cache.ttl(-1))
		var sys bytes.Buffer
		writeBlocks(&sys, blocks)
		top.Set("system", sys.Bytes())
		start = 1
	} else {
		top.Delete("system")
	}
	var w wire.BodyWriter
	err := wire.WriteObject(&w, top, "messages", func(w *wire.BodyWriter) error {
		return r.writeMessages(w, msgs, start, src, cache)
	})
	return w.Body(), err
}

func (r *Request) writeMessages(w *wire.BodyWriter, msgs []chat.Message, start int, src Source, cache Cache) error {
	w.WriteByte('[')
	n := 0
	for i := start; i < len(msgs); {
		// Consecutive user and tool messages are one Anthropic user turn.
		j := i + 1
		if msgs[i].Role == chat.User || msgs[i].Role == chat.Tool {
			for j < len(msgs) && (msgs[j].Role == chat.User || msgs[j].Role == chat.Tool) {
				j++
			}
		}
		breakpoint, ttl := false, ""
		for k := i; k < j; k++ {
			if slices.Contains(cache.Messages, k) {
				breakpoint, ttl = true, cache.ttl(k)
			}
		}
		if n > 0 {
			w.WriteByte(',')
		}
		n++
		if j == i+1 && !breakpoint && len(r.verbatim) > 0 {
			if canon, err := json.Marshal(msgs[i]); err == nil {
				if v, ok := r.verbatim[string(canon)]; ok {
					w.Write(v)
					i = j
					continue
				}
			}
		}
		key := ""
		if breakpoint {
			key = "cache_control " + ttl
		}
		turn := msgs[i:j]
		if err := r.memo.Write(w, i, turn, key, func(w wire.JSONWriter) error { return writeTurn(w, turn, src, breakpoint, ttl) }); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		i = j
	}
	w.WriteByte(']')
	return nil
}

// ours reports whether m's extra fields belong to this wire: a message
// decoded from another wire's JSON carries none of them here.
func ours(m chat.Message) bool { return m.Wire == "" || m.Wire == Wire }

func writeTurn(w wire.JSONWriter, msgs []chat.Message, src Source, breakpoint bool, ttl string) error {
	role := "user"
	switch msgs[0].Role {
	case chat.Assistant:
		role = "assistant"
	case chat.System:
		role = "system"
	}
	var blocks []block
	extra := map[string]json.RawMessage{}
	for _, m := range msgs {
		bs, err := encodeBlocks(m.Parts, src, ours(m))
		if err != nil {
			return err
		}
		blocks = append(blocks, bs...)
		if ours(m) {
			maps.Copy(extra, m.Extra)
		}
	}
	markBreakpoint(blocks, breakpoint, ttl)
	// Always blocks, never the string shorthand: a message encodes the same
	// with or without a breakpoint, so the prefix stays byte-stable.
	w.WriteString(`{"role":`)
	w.Write(mustJSON(role))
	w.WriteString(`,"content":`)
	writeBlocks(w, blocks)
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		w.WriteByte(',')
		w.Write(mustJSON(k))
		w.WriteByte(':')
		w.Write(extra[k])
	}
	w.WriteByte('}')
	return nil
}

// writeBlocks writes blocks as a JSON array, fields in the order of the
// block struct, then each block's extra fields.
func writeBlocks(w wire.JSONWriter, blocks []block) {
	field := func(key string, value []byte) {
		w.WriteString(`,"` + key + `":`)
		w.Write(value)
	}
	w.WriteByte('[')
	for i, b := range blocks {
		if i > 0 {
			w.WriteByte(',')
		}
		if b.raw != "" {
			w.WriteString(b.raw)
			continue
		}
		w.WriteString(`{"type":`)
		w.Write(mustJSON(b.Type))
		if b.Text != "" {
			field("text", mustJSON(b.Text))
		}
		if src := b.Source; src != nil {
			w.WriteString(`,"source":{"type":`)
			w.Write(mustJSON(src.Type))
			if src.MediaType != "" {
				field("media_type", mustJSON(src.MediaType))
			}
			if src.Data != "" {
				// Escaped when it must be: a client's data decoded from
				// JSON may hold what base64 never does (a "\n" it sent).
				w.WriteString(`,"data":`)
				wire.WriteString(w, src.Data)
			}
			if src.URL != "" {
				field("url", mustJSON(src.URL))
			}
			if src.FileID != "" {
				field("file_id", mustJSON(src.FileID))
			}
			w.WriteByte('}')
		}
		if b.ID != "" {
			field("id", mustJSON(b.ID))
		}
		if b.Name != "" {
			field("name", mustJSON(b.Name))
		}
		if len(b.Input) > 0 {
			field("input", mustJSON(b.Input))
		}
		if b.ToolUseID != "" {
			field("tool_use_id", mustJSON(b.ToolUseID))
		}
		if b.nested != nil {
			w.WriteString(`,"content":`)
			writeBlocks(w, b.nested)
		}
		if b.IsError {
			w.WriteString(`,"is_error":true`)
		}
		if b.Title != "" {
			field("title", mustJSON(b.Title))
		}
		if b.Cache != nil {
			field("cache_control", mustJSON(b.Cache))
		}
		wire.WriteExtra(w, b.extra)
		w.WriteByte('}')
	}
	w.WriteByte(']')
}

// markBreakpoint puts a cache breakpoint of that lifetime ("" the
// default) on the last block, unless the client already put its own there
// (in the block's extra fields).
func markBreakpoint(blocks []block, on bool, ttl string) {
	if last := len(blocks) - 1; on && last >= 0 && blocks[last].raw == "" && !strings.Contains(blocks[last].extra, `"cache_control"`) {
		blocks[last].Cache = &cacheControl{Type: "ephemeral", TTL: ttl}
	}
}

// MaxBreakpoints is how many cache_control blocks a request may carry.
const MaxBreakpoints = 4

// fit keeps imgctx's own breakpoints within what the client's leave: the
// client's count first, then the newest message, the last kept image, the
// system prompt (each later breakpoint caches the prefix before it anyway).
func (c Cache) fit(msgs []chat.Message) Cache {
	room := MaxBreakpoints - clientBreakpoints(msgs)
	var keep []int
	for i := len(c.Messages) - 1; i >= 0 && room > 0; i-- {
		keep = append([]int{c.Messages[i]}, keep...)
		room--
	}
	return Cache{System: c.System && room > 0, Messages: keep, Hour: c.Hour}
}

// clientBreakpoints counts the cache_control a client put on its blocks.
func clientBreakpoints(msgs []chat.Message) int {
	n := 0
	for _, m := range msgs {
		if !ours(m) {
			continue
		}
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			var extra string
			switch p := p.(type) {
			case chat.Text:
				extra = p.Extra
			case chat.Image:
				extra = p.Extra
			case chat.Document:
				extra = p.Extra
			case chat.ToolCall:
				extra = p.Extra
			case chat.ToolResult:
				extra = p.Extra
			case chat.Opaque:
				if p.Wire == Wire {
					extra = p.Raw
				}
			}
			n += strings.Count(extra, `"cache_control"`)
			return true
		})
	}
	return n
}

func encodeBlocks(parts []chat.Part, src Source, ours bool) ([]block, error) {
	var out []block
	text := func(s string) block { return block{Type: "text", Text: s} }
	extra := func(e string) string {
		if ours {
			return e
		}
		return ""
	}
	for _, p := range parts {
		switch p := p.(type) {
		case chat.Text:
			b := text(p.Text)
			b.extra = extra(p.Extra)
			out = append(out, b)
		case chat.Opaque:
			if p.Wire == Wire {
				out = append(out, block{raw: p.Raw})
			}
		case chat.Summary:
			out = append(out, text(p.Text))
		case chat.Marker:
			out = append(out, text(p.String()))
		case chat.Document:
			b, err := documentBlock(p, src)
			if err != nil {
				return nil, err
			}
			b.extra = extra(p.Extra)
			out = append(out, b)
		case chat.Image:
			mt, data, url, err := src(p)
			if err != nil {
				return nil, err
			}
			if id, ok := wire.FileOf(url); ok {
				out = append(out, block{Type: "image", Source: &source{Type: "file", FileID: id}, extra: extra(p.Extra)})
			} else if data != "" {
				out = append(out, block{Type: "image", Source: &source{Type: "base64", MediaType: mt, Data: data}, extra: extra(p.Extra)})
			} else {
				out = append(out, block{Type: "image", Source: &source{Type: "url", URL: url}, extra: extra(p.Extra)})
			}
		case chat.ToolCall:
			input := json.RawMessage(p.Arguments)
			if !json.Valid(input) {
				input = json.RawMessage("{}")
			}
			out = append(out, block{Type: "tool_use", ID: p.ID, Name: p.Name, Input: input, extra: extra(p.Extra)})
		case chat.ToolResult:
			nested, err := encodeBlocks(p.Parts, src, ours)
			if err != nil {
				return nil, err
			}
			if nested == nil {
				nested = []block{}
			}
			out = append(out, block{Type: "tool_result", ToolUseID: p.CallID, IsError: p.IsError, nested: nested, extra: extra(p.Extra)})
		}
	}
	return out, nil
}

// documentBlock writes a document natively: a stored one (a PDF) as a
// base64 source, byte-exact from its ref; a remote one by URL; extracted
// text as a text source.
func documentBlock(d chat.Document, src Source) (block, error) {
	b := block{Type: "document", Title: d.Name}
	switch {
	case d.Ref.Valid() || d.URL != "":
		// A document travels like an image: its ref's base64, or its URL.
		mt, data, url, err := src(chat.Image{Ref: d.Ref, MediaType: d.MediaType, URL: d.URL})
		if err != nil {
			return block{}, err
		}
		if data != "" {
			b.Source = &source{Type: "base64", MediaType: mt, Data: data}
		} else {
			b.Source = &source{Type: "url", URL: url}
		}
	default:
		b.Source = &source{Type: "text", MediaType: "text/plain", Data: d.Text}
	}
	return b, nil
}

func mustJSON(v any) json.RawMessage {
	b, err := wire.Marshal(v) // never HTML-escaped: "<" stays "<"
	if err != nil {
		panic(err) // only values built here, which always encode
	}
	return b
}

// Response is a decoded response, or a streamed one accumulated.
type Response struct {
	Message    chat.Message
	Usage      *chat.Usage
	StopReason string
	Cut        bool // max_tokens, or the window filled
	WindowFull bool // stop_reason model_context_window_exceeded
}

type usageJSON struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	// CacheCreation splits the writes by lifetime.
	CacheCreation *cacheCreationJSON `json:"cache_creation"`
}

type cacheCreationJSON struct {
	Hour int `json:"ephemeral_1h_input_tokens"`
}

// usage normalises Anthropic's three input fields: the prompt is their sum.
func (u *usageJSON) usage() *chat.Usage {
	if u == nil {
		return nil
	}
	out := &chat.Usage{
		Prompt:     u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens,
		CacheRead:  u.CacheReadInputTokens,
		CacheWrite: u.CacheCreationInputTokens,
		Output:     u.OutputTokens,
	}
	if u.CacheCreation != nil {
		out.CacheWriteHour = min(u.CacheCreation.Hour, out.CacheWrite)
	}
	return out
}

func stopped(reason string) (cut, full bool) {
	return reason == "max_tokens" || reason == "model_context_window_exceeded", reason == "model_context_window_exceeded"
}

// usageKeys are usageJSON's numbers, for wire.Ints.
var usageKeys = []string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens", "cache_creation.ephemeral_1h_input_tokens"}

// usageOf decodes a usage object: its numbers read from their spans, or
// by encoding/json where that might read them otherwise.
func usageOf(raw []byte) *chat.Usage {
	var n [5]int
	if wire.Ints(raw, usageKeys, n[:]) {
		// An absent cache_creation reads as 0, which min takes too: the
		// numbers are never negative here.
		u := usageJSON{InputTokens: n[0], CacheCreationInputTokens: n[1], CacheReadInputTokens: n[2], OutputTokens: n[3],
			CacheCreation: &cacheCreationJSON{Hour: n[4]}}
		return u.usage()
	}
	var u usageJSON
	if json.Unmarshal(raw, &u) != nil {
		return nil
	}
	return u.usage()
}

// DecodeResponse reads a non-streaming response.
func DecodeResponse(b []byte) (*Response, error) {
	var r struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		StopReason string          `json:"stop_reason"`
		Usage      *usageJSON      `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	if r.Role != "assistant" {
		return nil, fmt.Errorf("response role %q", r.Role)
	}
	parts, err := decodeContent(r.Content)
	if err != nil {
		return nil, fmt.Errorf("response content: %w", err)
	}
	cut, full := stopped(r.StopReason)
	return &Response{Message: chat.Message{Role: chat.Assistant, Parts: parts}, Usage: r.Usage.usage(),
		StopReason: r.StopReason, Cut: cut, WindowFull: full}, nil
}

// Stream accumulates streamed events into a Response.
type Stream struct {
	blocks []*streamBlock // pointers: a strings.Builder must not be copied
	stop   string
	usage  usageJSON
	seen   bool
	done   bool
	err    *wire.Error
}

type streamBlock struct {
	typ, id, name string
	text, input   strings.Builder
}

// Add takes one event (its name and data).
func (s *Stream) Add(name string, data []byte) error {
	var e struct {
		Type    string `json:"type"`
		Index   int    `json:"index"`
		Message struct {
			Usage *usageJSON `json:"usage"`
		} `json:"message"`
		ContentBlock block `json:"content_block"`
		Delta        struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage *usageJSON `json:"usage"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return fmt.Errorf("stream event %q: %w", name, err)
	}
	block := func() (*streamBlock, error) {
		if e.Index < 0 || e.Index >= len(s.blocks) {
			return nil, fmt.Errorf("stream event %q: block index %d out of range", e.Type, e.Index)
		}
		return s.blocks[e.Index], nil
	}
	switch e.Type {
	case "message_start":
		if u := e.Message.Usage; u != nil {
			s.usage, s.seen = *u, true
		}
	case "content_block_start":
		if e.Index != len(s.blocks) {
			return fmt.Errorf("stream: block %d started out of order", e.Index)
		}
		s.blocks = append(s.blocks, &streamBlock{typ: e.ContentBlock.Type, id: e.ContentBlock.ID, name: e.ContentBlock.Name})
		s.blocks[e.Index].text.WriteString(e.ContentBlock.Text)
	case "content_block_delta":
		b, err := block()
		if err != nil {
			return err
		}
		b.text.WriteString(e.Delta.Text)
		b.input.WriteString(e.Delta.PartialJSON)
	case "message_delta":
		if e.Delta.StopReason != "" {
			s.stop = e.Delta.StopReason
		}
		if u := e.Usage; u != nil {
			// message_delta carries the final counts; zero fields keep the start's.
			s.usage.OutputTokens = u.OutputTokens
			if u.InputTokens > 0 {
				s.usage.InputTokens = u.InputTokens
			}
			if u.CacheReadInputTokens > 0 {
				s.usage.CacheReadInputTokens = u.CacheReadInputTokens
			}
			if u.CacheCreationInputTokens > 0 {
				s.usage.CacheCreationInputTokens = u.CacheCreationInputTokens
			}
			if u.CacheCreation != nil && u.CacheCreation.Hour > 0 {
				s.usage.CacheCreation = u.CacheCreation
			}
			s.seen = true
		}
	case "message_stop":
		s.done = true
	case "error":
		s.err = &wire.Error{Status: 500, Kind: kindForType(e.Error.Type, 500), Type: e.Error.Type, Message: e.Error.Message, Body: data}
		classifyMessage(s.err)
	}
	return nil
}

// Done reports whether message_stop was seen.
func (s *Stream) Done() bool { return s.done }

// Err is the error event the stream carried, if any.
func (s *Stream) Err() *wire.Error { return s.err }

// Response returns what the stream said so far.
func (s *Stream) Response() *Response {
	msg := chat.Message{Role: chat.Assistant}
	for _, b := range s.blocks {
		switch b.typ {
		case "text":
			msg.Parts = append(msg.Parts, chat.Text{Text: b.text.String()})
		case "tool_use":
			input := b.input.String()
			if input == "" {
				input = "{}"
			}
			msg.Parts = append(msg.Parts, chat.ToolCall{ID: b.id, Name: b.name, Arguments: input})
		}
	}
	r := &Response{Message: msg, StopReason: s.stop}
	r.Cut, r.WindowFull = stopped(s.stop)
	if s.seen {
		r.Usage = s.usage.usage()
	}
	return r
}

func kindForType(t string, status int) wire.Kind {
	switch t {
	case "overloaded_error":
		return wire.Overloaded
	case "rate_limit_error":
		return wire.RateLimited
	case "authentication_error", "permission_error":
		return wire.Auth
	case "request_too_large":
		return wire.RequestTooLarge
	case "api_error":
		return wire.Server
	}
	return wire.KindForStatus(status)
}

func classifyMessage(e *wire.Error) {
	msg := strings.ToLower(e.Message)
	switch {
	case strings.Contains(msg, "prompt is too long") || strings.Contains(msg, "exceed context limit") ||
		strings.Contains(msg, "context window"):
		e.Kind = wire.PromptTooLong
	case e.Kind == wire.BadRequest && strings.Contains(msg, "image"):
		e.Kind = wire.InvalidImage
	}
}

// DecodeError classifies an error response:
// {"type": "error", "error": {"type", "message"}, "request_id"}.
func DecodeError(status int, h http.Header, body []byte) *wire.Error {
	e := &wire.Error{Status: status, Kind: wire.KindForStatus(status), Body: body, RetryAfter: wire.RetryAfter(h, time.Now())}
	var j struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &j) != nil || j.Error.Type == "" {
		e.Message = strings.TrimSpace(string(body[:min(len(body), 300)]))
		return e
	}
	e.Type, e.Message = j.Error.Type, j.Error.Message
	e.Kind = kindForType(j.Error.Type, status)
	classifyMessage(e)
	return e
}

// DecodeMessage reads one wire message (a user message of tool results and
// other blocks gives more than one, as in DecodeRequest).
func DecodeMessage(raw []byte) ([]chat.Message, error) { return decodeMessage(raw) }
