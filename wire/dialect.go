package wire

import (
	"net/http"

	"github.com/imgctx/imgctx/chat"
)

// Dialect is what imgctx needs of one wire format, in one value: how a
// drop-in route reads a client's body in place and writes the parts it
// rewrites, how it reads an answer's usage from a response or a stream, the
// token count it answers when an upstream has none, and how the upstream
// client calls a server of that format (path, headers, credentials, error
// shape). Each wire package exports its Dialect; adding a wire is its
// package and a line where routes and backends are chosen.
type Dialect struct {
	Name string // names the wire in keys, metrics and chat.Opaque parts

	// Scan reads a request body in place (Spliced).
	Scan func(body []byte, o ScanOptions) (*Spliced, error)
	// DecodeMessage reads one wire message for the text it bills.
	DecodeMessage func(raw []byte) ([]chat.Message, error)
	// WriteSource writes a slot's source with other bytes (an expanded ref,
	// a shrunk copy); WriteText writes a text part in a slot's place (a
	// marker, a note), cache being the slot's cache_control if any.
	WriteSource func(w *BodyWriter, mediaType, b64 string)
	WriteText   func(w *BodyWriter, text string, cache []byte)
	// AskUsage: a streamed answer carries usage only when asked
	// (OpenAI's stream_options.include_usage).
	AskUsage bool
	// Answer reads a non-streamed answer's usage and whether it was cut.
	Answer func(body []byte) (*chat.Usage, bool)
	// NewStream follows a streamed answer's events.
	NewStream func() StreamReader
	// CountAnswer is the wire's token-count answer (nil: none).
	CountAnswer func(tokens int) any

	// Path is the upstream's default request path ("" for a wire whose
	// path names the model); Headers are sent when the client sent none.
	Path    string
	Headers map[string]string
	// Credentials sets a configured key on an upstream request, in place of
	// whatever the client sent.
	Credentials func(req *http.Request, key string)
	// DecodeError classifies an upstream's error response.
	DecodeError func(status int, h http.Header, body []byte) *Error
}

// StreamReader follows a stream's events as they pass. Add says to skip an
// event imgctx asked for and the client did not (a usage-only chunk);
// Result is the usage, whether the answer was cut, and whether the stream
// ended as the wire says it ends.
type StreamReader interface {
	Add(ev Event, stripUsage bool) (skip bool)
	Result() (u *chat.Usage, cut, done bool)
}

// Bearer sets a key as "Authorization: Bearer".
func Bearer(req *http.Request, key string) { req.Header.Set("Authorization", "Bearer "+key) }
