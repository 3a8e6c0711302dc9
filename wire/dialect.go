package wire

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

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
	// Files, when set, is the provider's Files API for the wire's images
	// (upstreams[].file_ids).
	Files *Files
	// FoldRelay, when set, writes text at the end of the tool message whose
	// span is tool and leaves out the message after it, relay: a wire whose
	// tool messages hold text only has clients relay a tool's images in a
	// user message of their own, and once every image there is a marker,
	// that message would cost its framing on every later request (more
	// than the marker). nil: the tool message's content is not one it can
	// add to.
	FoldRelay func(body []byte, tool, relay Mark, text string) []Edit
	// Upstream names the format of the upstreams that serve the wire's
	// drop-in route (an OpenAI upstream serves the Responses API).
	Upstream string
	// FromPath, when set, reads what the wire puts in the URL path rather
	// than the body (Gemini: the model, and whether the answer streams).
	FromPath func(path string, sp *Spliced)
	// AskUsage, when set, is the edit that makes a streamed answer carry
	// its usage (OpenAI's stream_options.include_usage): nil when the body
	// asks already; strip when the client did not ask, so the usage-only
	// event is kept from it.
	AskUsage func(sp *Spliced) (e *Edit, strip bool)
	// Answer reads a non-streamed answer's usage and whether it was cut.
	Answer func(body []byte) (*chat.Usage, bool)
	// NewStream follows a streamed answer's events.
	NewStream func() StreamReader
	// CountAnswer is the wire's token-count answer (nil: none), given
	// when the upstream has no endpoint at the path that ends in CountPath.
	CountAnswer func(tokens int) any
	CountPath   string
	// ModelList merges the model listings of several upstreams into one in
	// the wire's shape; nil: the wire pages its listing its own way, and
	// the first upstream's goes as it answers.
	ModelList func(models []json.RawMessage) any
	// ErrorBody is an error imgctx answers with, in the wire's own shape;
	// typ is the OpenAI-style error type.
	ErrorBody func(status int, typ, msg string) any
	// TooLong is the type and message the wire's provider refuses a prompt
	// of prompt tokens with, past a window of window (for ErrorBody); nil
	// where imgctx does not answer so (proxy.client_window).
	TooLong func(prompt, window int) (typ, msg string)

	// Path is the upstream's default request path ("" for a wire whose
	// path names the model); Headers are sent when the client sent none.
	Path    string
	Headers map[string]string
	// Credentials sets a configured key on an upstream request, in place of
	// whatever the client sent.
	Credentials func(req *http.Request, key string)
	// DecodeError classifies an upstream's error response.
	DecodeError func(status int, h http.Header, body []byte) *Error

	// A client wire a flat backend can serve (Chat Completions, Messages)
	// decodes a whole request (DecodeRequest: its messages, whether it
	// streams) and writes a whole answer in its own shape, streamed or not
	// (Complete: the content type and the body).
	DecodeRequest func(body []byte) (msgs []chat.Message, stream bool, err error)
	Complete      func(model string, stream bool, c Completion) (contentType string, body []byte)
	// Flat is set for a backend that takes one prompt string and one flat
	// list of images (llama.cpp, Ollama; package wire/flat).
	Flat *Flat

	// A wire the sessions API speaks upstream encodes a session's live
	// context as one whole request (EncodeSession: pieces, sent as they
	// are) and decodes the whole answer (DecodeAnswer).
	EncodeSession func(r SessionRequest) (Body, error)
	DecodeAnswer  func(body []byte) (Answer, error)
}

// SessionRequest is a session's live context as it goes upstream.
type SessionRequest struct {
	Model     string
	MaxTokens int // a wire that needs a completion budget (Anthropic)
	Messages  []chat.Message
	// Source says how each image goes: a stored one as its base64 with its
	// media type, any other by its URL.
	Source func(img chat.Image) (mediaType, base64Data, url string, err error)
	// CacheSystem and CacheMessages are the prompt-cache breakpoints (the
	// system prompt; the last block of these messages), for a wire that
	// takes them (Anthropic).
	CacheSystem   bool
	CacheMessages []int
	// CacheHour: the breakpoints before the newest message's keep their
	// prefix for an hour, where the wire has such a lifetime (Anthropic's
	// "ttl": "1h"); the newest message's keeps the default.
	CacheHour bool
	// Tools are the tools imgctx itself offers the model (recall), in
	// the wire's own shape.
	Tools []Tool
	// Memo, when set, is the session's: turns encoded as the request
	// before wrote them are copied from it.
	Memo *Memo
}

// Tool is a function the model may call: its name, what it does, and its
// arguments as a JSON Schema object.
type Tool struct {
	Name, Description string
	Parameters        json.RawMessage
}

// Answer is an upstream's whole answer to a session request.
type Answer struct {
	Message    chat.Message
	Usage      *chat.Usage
	Cut        bool // stopped by the token limit
	WindowFull bool // stopped because the context window was full
}

// Completion is a whole answer as a flat backend gives it.
type Completion struct {
	Text           string
	Cut            bool // stopped by the token limit
	Prompt, Output int  // tokens
}

// Flat is how a flat backend is called: one prompt with its images
// (base64), the marker that stands for each image in the prompt when the
// backend wants one ("" otherwise), and its answer read.
type Flat struct {
	// Marked: the prompt holds one media marker per image, in order; the
	// backend names it (MarkerPath answers {"media_marker": …}) or takes
	// DefaultMarker.
	Marked                    bool
	MarkerPath, DefaultMarker string
	Request                   func(model, prompt string, images []string) ([]byte, error)
	Read                      func(body []byte) (Completion, error)
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

// CompletionID names an answer imgctx writes itself.
func CompletionID() string { return fmt.Sprintf("imgctx-%d", time.Now().UnixNano()) }
