package anthropic

import (
	"net/http"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Dialect is Anthropic Messages (/v1/messages, /v1/messages/count_tokens).
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeMessage, WriteSource: WriteSource, WriteText: WriteText,
	Answer: answer, NewStream: func() wire.StreamReader { return &streamReader{} },
	CountAnswer: func(n int) any { return map[string]int{"input_tokens": n} },
	Path:        "/v1/messages", Headers: map[string]string{"anthropic-version": "2023-06-01"},
	Credentials: func(req *http.Request, key string) { req.Header.Set("x-api-key", key) }, DecodeError: DecodeError,
}

// answer reads only the usage and the stop reason, not the whole answer.
func answer(b []byte) (*chat.Usage, bool) {
	var stop string
	wire.DecodeMember(b, "stop_reason", &stop)
	cut, _ := stopped(stop)
	return ResponseUsage(b), cut
}

type streamReader struct{ s Stream }

func (r *streamReader) Add(ev wire.Event, _ bool) bool {
	_ = r.s.Add(ev.Name, ev.Data)
	return false
}

func (r *streamReader) Result() (*chat.Usage, bool, bool) {
	resp := r.s.Response()
	return resp.Usage, resp.Cut, r.s.Done()
}
