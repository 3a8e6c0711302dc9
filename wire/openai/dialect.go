package openai

import (
	"bytes"
	"encoding/json"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// Dialect is OpenAI Chat Completions (/v1/chat/completions).
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeMessage,
	WriteSource: func(w *wire.BodyWriter, mediaType, b64 string) { wire.WriteDataURL(w, mediaType, b64) },
	WriteText:   func(w *wire.BodyWriter, text string, _ []byte) { WriteText(w, text) },
	AskUsage:    true, Answer: answer, NewStream: func() wire.StreamReader { return &streamReader{} },
	Path: "/v1/chat/completions", Credentials: wire.Bearer, DecodeError: DecodeError,
}

// answer reads only the usage and the choices' finish reasons, not the
// whole answer.
func answer(b []byte) (*chat.Usage, bool) {
	var choices []struct {
		FinishReason string `json:"finish_reason"`
	}
	wire.DecodeMember(b, "choices", &choices)
	cut := false
	for _, c := range choices {
		cut = cut || c.FinishReason == "length"
	}
	return ResponseUsage(b), cut
}

type streamReader struct{ s Stream }

func (r *streamReader) Add(ev wire.Event, strip bool) bool {
	_ = r.s.Add(ev.Data)
	return strip && usageOnly(ev.Data)
}

func (r *streamReader) Result() (*chat.Usage, bool, bool) {
	resp := r.s.Response()
	return resp.Usage, resp.Cut, r.s.Done()
}

// usageOnly reports whether a chunk is the one include_usage adds: no
// choices, a usage object — read as JSON, whatever the upstream's spacing.
func usageOnly(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) || bytes.Contains(data, []byte(`"delta"`)) {
		return false // a content chunk (with include_usage each carries "usage":null): no decoding
	}
	var c struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	return c.Choices != nil && len(*c.Choices) == 0 && len(c.Usage) > 0 && c.Usage[0] == '{'
}
