package gateway

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// dialect is what the proxy needs of a client route's wire: how to read a
// body in place, how to write a slot's new source or a text part in a
// slot's place, how to read an answer's usage, and which upstreams serve
// it. Adding a drop-in route is one value here.
type dialect struct {
	name   string          // names the wire in keys and metrics
	format upstream.Format // the upstreams that serve it
	shape  shape
	scan   func([]byte, wire.ScanOptions) (*wire.Spliced, error)
	// decode reads one wire message for its text (measurements).
	decode func([]byte) ([]chat.Message, error)
	// source writes a slot's source with other bytes; text writes a text
	// part where a slot was (cache is the slot's cache_control, if any).
	source func(w *wire.BodyWriter, mediaType, b64 string)
	text   func(w *wire.BodyWriter, text string, cache []byte)
	// askUsage: streamed answers carry usage only when asked
	// (stream_options.include_usage).
	askUsage bool
	answer   func([]byte) (*chat.Usage, bool)
	stream   func() eventReader
	// fromPath, when set, reads what the wire puts in the URL rather than
	// the body (Gemini: the model, and whether the answer streams).
	fromPath func(r *http.Request, sp *wire.Spliced)
	// count is the wire's token-count answer, for an upstream without
	// that endpoint.
	count func(n int) any
}

// eventReader follows a stream's events: skip says an event imgctx asked
// for and the client did not (a usage-only chunk).
type eventReader interface {
	add(ev wire.Event, stripUsage bool) (skip bool)
	result() (u *chat.Usage, cut, done bool)
}

var (
	chatDialect = &dialect{name: "openai", format: upstream.OpenAI, shape: openaiShape, scan: openai.Scan, decode: openai.DecodeMessage,
		source: dataURL, text: func(w *wire.BodyWriter, text string, _ []byte) { openai.WriteText(w, text) },
		askUsage: true, answer: openaiAnswer, stream: func() eventReader { return &openaiEvents{} }}
	messagesDialect = &dialect{name: "anthropic", format: upstream.Anthropic, shape: anthropicShape, scan: anthropic.Scan, decode: anthropic.DecodeMessage,
		source: anthropic.WriteSource, text: anthropic.WriteText,
		answer: anthropicAnswer, stream: func() eventReader { return &anthropicEvents{} },
		count: func(n int) any { return map[string]int{"input_tokens": n} }}
	geminiDialect = &dialect{name: "gemini", format: upstream.Gemini, shape: geminiShape, scan: gemini.Scan, decode: gemini.DecodeContent,
		source: gemini.WriteSource, text: func(w *wire.BodyWriter, text string, _ []byte) { gemini.WriteText(w, text) },
		answer: geminiAnswer, stream: func() eventReader { return &geminiEvents{} }, fromPath: geminiCall,
		count: func(n int) any { return map[string]int{"totalTokens": n} }}
	responsesDialect = &dialect{name: "responses", format: upstream.OpenAI, shape: openaiShape, scan: responses.Scan, decode: responses.DecodeItem,
		source: dataURL, text: func(w *wire.BodyWriter, text string, _ []byte) { responses.WriteText(w, text) },
		answer: responsesAnswer, stream: func() eventReader { return &responsesEvents{} },
		count: func(n int) any { return map[string]any{"object": "response.input_tokens", "input_tokens": n} }}
)

// dataURL writes a source that is a data URL string (OpenAI's url,
// Responses' image_url and file_data).
func dataURL(w *wire.BodyWriter, mediaType, b64 string) { wire.WriteDataURL(w, mediaType, b64) }

func openaiAnswer(b []byte) (*chat.Usage, bool) {
	r, err := openai.DecodeResponse(b)
	if err != nil {
		return openai.ResponseUsage(b), false
	}
	return r.Usage, r.Cut
}

func anthropicAnswer(b []byte) (*chat.Usage, bool) {
	r, err := anthropic.DecodeResponse(b)
	if err != nil {
		return anthropic.ResponseUsage(b), false
	}
	return r.Usage, r.Cut
}

func geminiAnswer(b []byte) (*chat.Usage, bool) {
	u, cut, _ := gemini.DecodeResponse(b)
	return u, cut
}

// geminiCall reads /v1beta/models/{model}:{method}: the model, and
// whether the method streams.
func geminiCall(r *http.Request, sp *wire.Spliced) {
	model, method, _ := strings.Cut(r.PathValue("call"), ":")
	sp.Model, sp.Stream = model, method == "streamGenerateContent"
}

type geminiEvents struct{ s gemini.Stream }

func (e *geminiEvents) add(ev wire.Event, _ bool) bool {
	e.s.Add(ev.Data)
	return false
}

func (e *geminiEvents) result() (*chat.Usage, bool, bool) {
	u, cut := e.s.Usage()
	return u, cut, e.s.Done()
}

func responsesAnswer(b []byte) (*chat.Usage, bool) {
	u, cut, _ := responses.DecodeResponse(b)
	return u, cut
}

type openaiEvents struct{ s openai.Stream }

func (e *openaiEvents) add(ev wire.Event, strip bool) bool {
	_ = e.s.Add(ev.Data)
	return strip && usageOnly(ev.Data)
}

func (e *openaiEvents) result() (*chat.Usage, bool, bool) {
	r := e.s.Response()
	return r.Usage, r.Cut, e.s.Done()
}

// usageOnly reports whether a chunk is the one include_usage adds: no
// choices, a usage object.
func usageOnly(data []byte) bool {
	return bytes.Contains(data, []byte(`"usage":{`)) && bytes.Contains(data, []byte(`"choices":[]`))
}

type anthropicEvents struct{ s anthropic.Stream }

func (e *anthropicEvents) add(ev wire.Event, _ bool) bool {
	_ = e.s.Add(ev.Name, ev.Data)
	return false
}

func (e *anthropicEvents) result() (*chat.Usage, bool, bool) {
	r := e.s.Response()
	return r.Usage, r.Cut, e.s.Done()
}

type responsesEvents struct{ s responses.Stream }

func (e *responsesEvents) add(ev wire.Event, _ bool) bool {
	e.s.Add(ev.Data)
	return false
}

func (e *responsesEvents) result() (*chat.Usage, bool, bool) {
	u, cut := e.s.Usage()
	return u, cut, e.s.Done()
}
