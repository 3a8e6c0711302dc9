package gemini

import (
	"net/http"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Dialect is Gemini generateContent (/v1beta/models/{model}:…): the path
// names the model, so it has no default path.
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeContent, WriteSource: WriteSource,
	WriteText: func(w *wire.BodyWriter, text string, _ []byte) { WriteText(w, text) },
	Answer: func(b []byte) (*chat.Usage, bool) {
		u, cut, _ := DecodeResponse(b)
		return u, cut
	},
	NewStream:   func() wire.StreamReader { return &streamReader{} },
	CountAnswer: func(n int) any { return map[string]int{"totalTokens": n} },
	Credentials: func(req *http.Request, key string) {
		req.Header.Set("x-goog-api-key", key)
		if q := req.URL.Query(); q.Has("key") { // the client's own, replaced
			q.Del("key")
			req.URL.RawQuery = q.Encode()
		}
	},
	DecodeError: DecodeError,
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
