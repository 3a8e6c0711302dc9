package anthropic

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Dialect is Anthropic Messages (/v1/messages, /v1/messages/count_tokens).
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeMessage, WriteSource: WriteSource, WriteText: WriteText, Files: Files,
	Answer: answer, NewStream: func() wire.StreamReader { return &streamReader{} },
	CountAnswer: func(n int) any { return map[string]int{"input_tokens": n} }, CountPath: "/count_tokens",
	Upstream: Wire, ErrorBody: ErrorBody, TooLong: tooLong, ModelList: modelList, EncodeSession: encodeSession, DecodeAnswer: decodeAnswer, DecodeRequest: decodeRequest, Complete: complete,
	Path: "/v1/messages", Headers: map[string]string{"anthropic-version": "2023-06-01"},
	Credentials: func(req *http.Request, key string) { req.Header.Set("x-api-key", key) }, DecodeError: DecodeError,
}

func encodeSession(r wire.SessionRequest) (wire.Body, error) {
	req := NewRequest(r.Model, r.MaxTokens)
	if len(r.Tools) > 0 {
		type tool struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"input_schema"`
		}
		tools := make([]tool, len(r.Tools))
		for i, t := range r.Tools {
			tools[i] = tool{t.Name, t.Description, t.Parameters}
		}
		req.top.Set("tools", mustJSON(tools))
	}
	req.memo = r.Memo
	b, err := req.EncodeBody(r.Messages, r.Source, Cache{System: r.CacheSystem, Messages: r.CacheMessages, Hour: r.CacheHour})
	if err == nil {
		r.Memo.Done()
	}
	return b, err
}

func decodeAnswer(b []byte) (wire.Answer, error) {
	r, err := DecodeResponse(b)
	if err != nil {
		return wire.Answer{}, err
	}
	return wire.Answer{Message: r.Message, Usage: r.Usage, Cut: r.Cut, WindowFull: r.WindowFull}, nil
}

func decodeRequest(body []byte) ([]chat.Message, bool, error) {
	req, err := DecodeRequest(body)
	if err != nil {
		return nil, false, err
	}
	return req.Messages, req.Stream, nil
}

// complete writes a whole answer as a message, or as the events of one
// carrying the whole text.
func complete(model string, stream bool, a wire.Completion) (string, []byte) {
	id := wire.CompletionID()
	stop := "end_turn"
	if a.Cut {
		stop = "max_tokens"
	}
	if !stream {
		b, _ := wire.Marshal(map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
			"content": []map[string]any{{"type": "text", "text": a.Text}}, "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": a.Prompt, "output_tokens": a.Output}})
		return "application/json", b
	}
	var b []byte
	b = wire.AppendEvent(b, "message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": a.Prompt, "output_tokens": 0}}})
	b = wire.AppendEvent(b, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	b = wire.AppendEvent(b, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": a.Text}})
	b = wire.AppendEvent(b, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	b = wire.AppendEvent(b, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": a.Output}})
	b = wire.AppendEvent(b, "message_stop", map[string]any{"type": "message_stop"})
	return "text/event-stream", b
}

// modelList is one page holding every model, named by its first and last.
func modelList(models []json.RawMessage) any {
	out := map[string]any{"data": models, "has_more": false, "first_id": nil, "last_id": nil}
	if len(models) > 0 {
		out["first_id"], out["last_id"] = modelID(models[0]), modelID(models[len(models)-1])
	}
	return out
}

func modelID(raw json.RawMessage) any {
	var m struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m.ID
}

// ErrorBody is an error in Anthropic's shape.
func ErrorBody(_ int, typ, msg string) any {
	return map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}}
}

// answer reads only the usage and the stop reason, not the whole answer.
func answer(b []byte) (*chat.Usage, bool) {
	var m [2][]byte // one pass for both
	wire.Members(b, []string{"stop_reason", "usage"}, m[:])
	stop, _ := jsonspan.String(m[0], 0, len(m[0]))
	cut, _ := stopped(stop)
	if m[1] == nil {
		return nil, cut
	}
	return usageOf(m[1]), cut
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

// tooLong is Anthropic's refusal of a prompt past the window.
func tooLong(prompt, window int) (string, string) {
	return "invalid_request_error", fmt.Sprintf("prompt is too long: %d tokens > %d maximum", prompt, window)
}
