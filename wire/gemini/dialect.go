package gemini

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Dialect is Gemini generateContent (/v1beta/models/{model}:…): the path
// names the model, so it has no default path.
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeContent, WriteSource: WriteSource, Files: Files,
	WriteText: func(w *wire.BodyWriter, text string, _ []byte) { WriteText(w, text) },
	Answer: func(b []byte) (*chat.Usage, bool) {
		u, cut, _ := DecodeResponse(b)
		return u, cut
	},
	NewStream:   func() wire.StreamReader { return &streamReader{} },
	CountAnswer: func(n int) any { return map[string]int{"totalTokens": n} }, CountPath: ":countTokens",
	Upstream: Wire, FromPath: fromPath, ErrorBody: ErrorBody, TooLong: tooLong,
	Credentials: func(req *http.Request, key string) {
		req.Header.Set("x-goog-api-key", key)
		if q := req.URL.Query(); q.Has("key") { // the client's own, replaced
			q.Del("key")
			req.URL.RawQuery = q.Encode()
		}
	},
	DecodeError: DecodeError,
}

// fromPath reads /v1beta/models/{model}:{method}: the model, and whether
// the method streams.
func fromPath(path string, sp *wire.Spliced) {
	call := path[strings.LastIndexByte(path, '/')+1:]
	model, method, _ := strings.Cut(call, ":")
	sp.Model, sp.Stream = model, method == "streamGenerateContent"
}

// ErrorBody is an error in Google's shape: the HTTP code, and the
// canonical status Google APIs name it by.
func ErrorBody(status int, _, msg string) any {
	return map[string]any{"error": map[string]any{"code": status, "message": msg, "status": googleStatus(status)}}
}

func googleStatus(code int) string {
	switch code {
	case 400, 413:
		return "INVALID_ARGUMENT"
	case 401:
		return "UNAUTHENTICATED"
	case 403:
		return "PERMISSION_DENIED"
	case 404:
		return "NOT_FOUND"
	case 409:
		return "ABORTED"
	case 429:
		return "RESOURCE_EXHAUSTED"
	case 502, 503:
		return "UNAVAILABLE"
	case 504, 408:
		return "DEADLINE_EXCEEDED"
	}
	return "INTERNAL"
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

// tooLong is Gemini's refusal of a prompt past the window.
func tooLong(prompt, window int) (string, string) {
	return "invalid_request_error", fmt.Sprintf("The input token count (%d) exceeds the maximum number of tokens allowed (%d).", prompt, window)
}
