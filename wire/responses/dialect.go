package responses

import (
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
)

// Dialect is OpenAI Responses (/v1/responses and its input_tokens and
// compact side routes); errors have OpenAI's shape.
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeItem, Files: Files,
	WriteSource: func(w *wire.BodyWriter, mediaType, b64 string) { wire.WriteDataURL(w, mediaType, b64) },
	WriteText:   func(w *wire.BodyWriter, text string, _ []byte) { WriteText(w, text) },
	Answer: func(b []byte) (*chat.Usage, bool) {
		u, cut, _ := DecodeResponse(b)
		return u, cut
	},
	NewStream:   func() wire.StreamReader { return &streamReader{} },
	CountAnswer: func(n int) any { return map[string]any{"object": "response.input_tokens", "input_tokens": n} }, CountPath: "/input_tokens",
	Upstream: openai.Wire, ErrorBody: openai.ErrorBody, TooLong: openai.TooLong,
	Path: "/v1/responses", Credentials: wire.Bearer, DecodeError: openai.DecodeError,
}

type streamReader struct{ s Stream }

func (r *streamReader) Add(ev wire.Event, _ bool) bool {
	r.s.Add(ev.Data)
	return false
}

func (r *streamReader) Result() (*chat.Usage, bool, bool) {
	u, cut := r.s.Usage()
	return u, cut, r.s.Done()
}
